//! The value format: round trips, and every way a value can be wrong.

use super::*;

fn corrupt_reason(result: Result<Checksum, StoreError>) -> String {
    match result {
        Err(StoreError::Corrupt { reason, .. }) => reason,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_value_round_trips() {
    let bytes = [9u8; 24];
    let sum = Checksum::of(5, &bytes);
    let value = encode(5, sum, &bytes);
    assert_eq!(value.len(), HEADER_BYTES + 24);
    assert_eq!(
        header(&value).unwrap(),
        Header {
            key: 5,
            checksum: sum
        }
    );
    let mut out = [0u8; 24];
    assert_eq!(decode(5, &value, &mut out).unwrap(), sum);
    assert_eq!(out, bytes);
}

#[test]
fn every_mismatch_is_corrupt_and_leaves_the_buffer_alone() {
    let bytes = [9u8; 24];
    let value = encode(5, Checksum::of(5, &bytes), &bytes);
    let mut out = [0u8; 24];

    assert!(corrupt_reason(decode(5, &value[..10], &mut out)).contains("shorter"));
    assert!(corrupt_reason(decode(6, &value, &mut out)).contains("filed under"));
    assert!(corrupt_reason(decode(5, &value, &mut [0u8; 23])).contains("24 bytes stored"));

    let mut flipped = value.clone();
    flipped[HEADER_BYTES + 3] ^= 1;
    assert!(corrupt_reason(decode(5, &flipped, &mut out)).contains("checksum"));

    let mut magic = value;
    magic[0] = b'X';
    assert!(corrupt_reason(decode(5, &magic, &mut out)).contains("magic"));
    assert_eq!(out, [0u8; 24]);
}
