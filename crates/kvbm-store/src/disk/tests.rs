//! Unit tests of the disk store's format.

use super::layout::{Geometry, HEADER, Header, META_LEN, Meta, SlotHeader, dead_header};
use crate::Checksum;

#[test]
fn geometries_that_cannot_be_addressed_are_refused() {
    assert!(Geometry::new(0, 1, None).is_err());
    assert!(Geometry::new(1, 0, None).is_err());
    assert!(Geometry::new(usize::MAX, 1, None).is_err());
    assert!(Geometry::new(1, usize::MAX, None).is_err());
    assert!(Geometry::new(1, 1, Some(0)).is_err());
    // Too many files.
    assert!(Geometry::new(1, 1 << 20, Some(1)).is_err());
    let geometry = Geometry::new(5000, 10, Some(4)).unwrap();
    assert_eq!(geometry.stride(), 8192);
    assert_eq!(geometry.files(), 3);
    assert_eq!(geometry.slots_in_file(2), 2);
    assert_eq!(geometry.place(9), (2, 8192));
}

#[test]
fn a_meta_round_trips_and_a_hostile_one_is_refused() {
    let geometry = Geometry::new(64, 100, Some(10)).unwrap();
    let bytes = geometry.encode_meta();
    let meta = Meta::decode(&bytes).unwrap();
    assert_eq!(meta.block_bytes, 64);
    assert_eq!(meta.geometry(64).unwrap(), geometry);

    // A declared capacity of 2^60 with a checksum that matches: refused by
    // range, never allocated.
    let mut hostile = bytes;
    hostile[40..48].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&hostile[..48]);
    hostile[48..56].copy_from_slice(&sum.to_le_bytes());
    let meta = Meta::decode(&hostile).unwrap();
    assert!(meta.geometry(64).is_err());

    // Slots per file of 0, and a stride that is not this block size's.
    let mut zero = bytes;
    zero[32..40].copy_from_slice(&0u64.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&zero[..48]);
    zero[48..56].copy_from_slice(&sum.to_le_bytes());
    assert!(Meta::decode(&zero).unwrap().geometry(64).is_err());
    assert!(Meta::decode(&bytes).unwrap().geometry(8000).is_err());

    // Flipped bits, short and long files.
    let mut flipped = bytes;
    flipped[20] ^= 1;
    assert!(Meta::decode(&flipped).is_err());
    assert!(Meta::decode(&bytes[..META_LEN - 1]).is_err());
    assert!(Meta::decode(&[0; META_LEN + 1]).is_err());
}

#[test]
fn slot_headers_round_trip_and_every_flipped_bit_is_caught() {
    let header = Header {
        key: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
        checksum: Checksum::from_raw(77),
        len: 4096,
        seq: 9,
        lineage: crate::Lineage {
            parent: Some(u128::MAX - 5),
            position: 70_000,
        },
    };
    let bytes = header.encode();
    let root = Header {
        lineage: crate::Lineage::ROOT,
        ..header
    };
    assert_eq!(SlotHeader::decode(&root.encode()), SlotHeader::Live(root));
    assert_eq!(SlotHeader::decode(&bytes), SlotHeader::Live(header));
    assert_eq!(SlotHeader::decode(&dead_header()), SlotHeader::Dead);
    assert_eq!(SlotHeader::decode(&[0; HEADER]), SlotHeader::Empty);
    for bit in 0..HEADER * 8 {
        let mut flipped = bytes;
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(matches!(SlotHeader::decode(&flipped), SlotHeader::Bad(_)));
    }
}
