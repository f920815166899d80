//! What `decode` allocates: a small multiple of its input, whatever a peer
//! sends (issue 21, item 12).
//!
//! Measured with dhat, in a test binary of its own. Counting heap takes a
//! `#[global_allocator]`, and writing one takes `unsafe impl GlobalAlloc`,
//! which the workspace forbids in tests too; dhat (Nicholas Nethercote's
//! port of Valgrind's DHAT, maintained with rustc's profiling tools) is that
//! allocator behind a safe API, and its testing mode reports exact byte
//! counts, the peak among them (`max_bytes`: the most bytes live at once;
//! a `realloc` counts its new size only, not old and new together). A global
//! allocator serves a whole binary, and dhat counts every thread and allows
//! one profiler at a time, so everything here is one test that profiles one
//! decode after another, each payload built before its profiler starts.

#![forbid(unsafe_code)]

use kvbm_events::{BlockHash, BlockStored, EventError, KvEvent, KvEventBatch, decode, encode};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// What `bytes` decode to, and the most heap live at once while they did.
fn peak_heap_of_decode(bytes: &[u8]) -> (Result<KvEventBatch, EventError>, usize) {
    let profiler = dhat::Profiler::builder().testing().build();
    let decoded = decode(bytes);
    let peak = dhat::HeapStats::get().max_bytes;
    drop(profiler);
    (decoded, peak)
}

/// A msgpack fixstr.
fn s(text: &str) -> Vec<u8> {
    assert!(text.len() < 32);
    [&[0xa0 | text.len() as u8], text.as_bytes()].concat()
}

/// A batch `[1.0, [event]` cut after `event` (which is itself cut short):
/// every hostile payload below ends inside the thing it lies about.
fn batch_around(events_header: &[u8], event: &[u8]) -> Vec<u8> {
    [
        &[0x93, 0xcb][..],
        &1.0f64.to_be_bytes(),
        events_header,
        event,
    ]
    .concat()
}

/// An array32 header declaring 2^32 - 1 elements.
const HUGE_ARRAY: [u8; 5] = [0xdd, 0xff, 0xff, 0xff, 0xff];

#[test]
fn decode_allocates_a_small_multiple_of_its_input() {
    // 1. A ~1 MB BlockStored, nearly all tokens in 1-byte fixints: the worst
    // case, since each becomes a 4-byte u32 (the bound is 6x of it, the old
    // internally tagged derive peaked near 40x). Just over 2^20 tokens, where
    // a Vec grown by doubling would hold twice the room they need (8x).
    let tokens = 1_050_000;
    let stored = KvEventBatch::new(
        1.0,
        vec![KvEvent::BlockStored(
            BlockStored::new(
                (0..1050).map(|i| BlockHash::Int(u64::MAX - i)).collect(),
                Some(BlockHash::Int(7)),
                (0..tokens).map(|t| t % 128).collect(),
                1000,
            )
            .with_medium("GPU"),
        )],
    );
    let bytes = encode(&stored).unwrap();
    let (decoded, peak) = peak_heap_of_decode(&bytes);
    eprintln!(
        "1 MB BlockStored: {} bytes in, peak heap {peak} bytes ({:.2}x)",
        bytes.len(),
        peak as f64 / bytes.len() as f64
    );
    assert_eq!(decoded.unwrap(), stored);
    assert!(
        peak <= 6 * bytes.len(),
        "peak heap {peak} for a payload of {}",
        bytes.len()
    );

    // 2. A megabyte of a field kvbm does not read (vLLM's `extra_keys`,
    // say): skipped in place, never held.
    let mut unknown = batch_around(&[0x91], &[0x82]);
    unknown.extend(s("type"));
    unknown.extend(s("AllBlocksCleared"));
    unknown.extend(s("extra_keys"));
    unknown.push(0xdd); // array32
    unknown.extend(1_000_000u32.to_be_bytes());
    unknown.extend(std::iter::repeat_n(0x7f, 1_000_000));
    unknown.push(0xc0);
    let (decoded, peak) = peak_heap_of_decode(&unknown);
    eprintln!("1 MB unknown field: peak heap {peak} bytes");
    assert_eq!(decoded.unwrap().events(), [KvEvent::AllBlocksCleared]);
    assert!(peak < 16 * 1024, "peak heap {peak} to skip a field");

    // 3. Hashes sent as arrays of byte values (accepted, like bin): each
    // element one byte in, one byte out.
    let mut byte_arrays = batch_around(&[0x91], &[0x82]);
    byte_arrays.extend(s("type"));
    byte_arrays.extend(s("BlockRemoved"));
    byte_arrays.extend(s("block_hashes"));
    byte_arrays.extend([0xdc, 0x00, 0x20]); // 32 hashes
    for _ in 0..32 {
        byte_arrays.extend([0xdc, 0x80, 0x00]); // of 32,768 byte values each
        byte_arrays.extend(std::iter::repeat_n(0x01, 0x8000));
    }
    byte_arrays.push(0xc0);
    let (decoded, peak) = peak_heap_of_decode(&byte_arrays);
    eprintln!(
        "1 MB of byte-array hashes: {} bytes in, peak heap {peak} bytes",
        byte_arrays.len()
    );
    let decoded = decoded.unwrap();
    let KvEvent::BlockRemoved(removed) = &decoded.events()[0] else {
        panic!("not a BlockRemoved: {decoded:?}");
    };
    let hash = BlockHash::Bytes(vec![1; 0x8000].into());
    assert_eq!(removed.block_hashes, vec![hash; 32]);
    assert!(peak <= 2 * byte_arrays.len(), "peak heap {peak}");

    // 4. Lengths declared huge with a few bytes behind them: refused, and
    // no more allocated than serde's cap on a preallocation (1 MiB per
    // collection, two nested here at most) where the declared sizes run to
    // gigabytes.
    let stored_event = |field: &str, value: &[u8]| {
        [&[0x82][..], &s("type"), &s("BlockStored"), &s(field), value].concat()
    };
    let hostile: [(&str, Vec<u8>); 8] = [
        (
            "events array",
            batch_around(
                &HUGE_ARRAY,
                &[&[0x81][..], &s("type"), &s("AllBlocksCleared")].concat(),
            ),
        ),
        (
            "events and token_ids arrays",
            batch_around(
                &HUGE_ARRAY,
                &stored_event("token_ids", &[&HUGE_ARRAY[..], &[1, 2]].concat()),
            ),
        ),
        (
            "block_hashes array",
            batch_around(&[0x91], &stored_event("block_hashes", &HUGE_ARRAY)),
        ),
        (
            "a hash's bin",
            batch_around(
                &[0x91],
                &stored_event("block_hashes", &[0x91, 0xc6, 0xff, 0xff, 0xff, 0xff, 0]),
            ),
        ),
        (
            "a hash's byte array",
            batch_around(
                &[0x91],
                &stored_event("block_hashes", &[&[0x91][..], &HUGE_ARRAY, &[1]].concat()),
            ),
        ),
        (
            "medium's str",
            batch_around(
                &[0x91],
                &stored_event("medium", &[0xdb, 0xff, 0xff, 0xff, 0xff, b'G']),
            ),
        ),
        (
            "the event map",
            batch_around(
                &[0x91],
                &[&[0xdf, 0xff, 0xff, 0xff, 0xff][..], &s("type")].concat(),
            ),
        ),
        (
            "an unknown field's map",
            batch_around(
                &[0x91],
                &stored_event("extra_keys", &[0xdf, 0xff, 0xff, 0xff, 0xff, 1]),
            ),
        ),
    ];
    for (what, bytes) in hostile {
        let (decoded, peak) = peak_heap_of_decode(&bytes);
        eprintln!(
            "huge {what} declared in {} bytes: peak heap {peak} bytes",
            bytes.len()
        );
        assert!(
            matches!(decoded, Err(EventError::Decode(_))),
            "{what}: {decoded:?}"
        );
        assert!(peak <= 5 << 19, "{what}: peak heap {peak}");
    }
}
