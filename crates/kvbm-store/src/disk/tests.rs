//! Unit tests of the disk store's format, of its coalesced writes of runs
//! of slots under short and failing writes, and of its verified reads of
//! large blocks piece by piece under short and interrupted reads.

use std::io::{self, IoSlice, IoSliceMut};
use std::ops::Range;

use super::files::{READ_CHUNK, RUN_SLOTS, SlotWrite, read_slot_with, write_run_with};
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

/// A file in memory whose positional vectored writes write at most
/// `per_call` bytes, stop short of `bad` (a range that cannot be written:
/// a full disk past its start, a bad sector) and then fail, and fail
/// outright for the first `flaky` calls of more than one slot after
/// writing half of what they were given.
struct FakeFile {
    bytes: Vec<u8>,
    per_call: usize,
    bad: Range<u64>,
    flaky: usize,
    calls: usize,
}

impl FakeFile {
    fn new() -> Self {
        Self {
            bytes: Vec::new(),
            per_call: usize::MAX,
            bad: u64::MAX..u64::MAX,
            flaky: 0,
            calls: 0,
        }
    }

    fn pwritev(&mut self, parts: &[IoSlice<'_>], at: u64) -> io::Result<usize> {
        self.calls += 1;
        let data: Vec<u8> = parts.iter().flat_map(|part| part.iter().copied()).collect();
        let mut len = data.len().min(self.per_call);
        let flaky = self.flaky > 0 && data.len() > STRIDE as usize;
        if flaky {
            self.flaky -= 1;
            len /= 2;
        }
        let end = at + len as u64;
        if at < self.bad.end && end > self.bad.start {
            len = self.bad.start.saturating_sub(at) as usize;
        }
        if len == 0 {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        let at = at as usize;
        if self.bytes.len() < at + len {
            self.bytes.resize(at + len, 0);
        }
        self.bytes[at..at + len].copy_from_slice(&data[..len]);
        if flaky {
            return Err(io::Error::other("an i/o error partway"));
        }
        Ok(len)
    }

    /// Whether slot `nth` holds `header` and `block`.
    fn holds(&self, nth: usize, header: &[u8; HEADER], block: &[u8]) -> bool {
        let at = nth * STRIDE as usize;
        self.bytes.get(at..at + HEADER) == Some(&header[..])
            && self.bytes.get(at + HEADER..at + HEADER + block.len()) == Some(block)
    }
}

/// Slots of the run tests: a 200-byte block after the header, padded to
/// 512 bytes.
const STRIDE: u64 = 512;
const BLOCK: usize = 200;

/// `n` slots' headers and blocks, each of its own bytes.
fn run_of(n: usize) -> (Vec<[u8; HEADER]>, Vec<Vec<u8>>) {
    let headers = (0..n).map(|i| [i as u8 + 1; HEADER]).collect();
    let blocks = (0..n).map(|i| vec![0x80 | i as u8; BLOCK]).collect();
    (headers, blocks)
}

fn writes<'a>(headers: &'a [[u8; HEADER]], blocks: &'a [Vec<u8>]) -> Vec<SlotWrite<'a>> {
    headers
        .iter()
        .zip(blocks)
        .map(|(header, block)| SlotWrite { header, block })
        .collect()
}

#[test]
fn a_run_is_one_write_of_its_slots_and_their_padding() {
    let (headers, blocks) = run_of(5);
    let mut file = FakeFile::new();
    let results = write_run_with(STRIDE, STRIDE, &writes(&headers, &blocks), |parts, at| {
        file.pwritev(parts, at)
    });
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(file.calls, 1);
    for nth in 0..5 {
        assert!(file.holds(nth + 1, &headers[nth], &blocks[nth]));
    }
    // Padding between slots is zeros; the last slot's is not written.
    let pad = STRIDE as usize + HEADER + BLOCK..2 * STRIDE as usize;
    assert!(file.bytes[pad].iter().all(|&b| b == 0));
    assert_eq!(file.bytes.len(), 5 * STRIDE as usize + HEADER + BLOCK);
}

#[test]
fn short_writes_are_finished() {
    let (headers, blocks) = run_of(4);
    let mut file = FakeFile::new();
    file.per_call = 77;
    let results = write_run_with(STRIDE, 0, &writes(&headers, &blocks), |parts, at| {
        file.pwritev(parts, at)
    });
    assert!(results.iter().all(Result::is_ok));
    for nth in 0..4 {
        assert!(file.holds(nth, &headers[nth], &blocks[nth]));
    }
}

#[test]
fn a_disk_full_mid_run_fails_only_the_slots_not_written_whole() {
    let (headers, blocks) = run_of(6);
    let mut file = FakeFile::new();
    // Full from the middle of slot 2's block on.
    file.bad = 2 * STRIDE + HEADER as u64 + 50..u64::MAX;
    let results = write_run_with(STRIDE, 0, &writes(&headers, &blocks), |parts, at| {
        file.pwritev(parts, at)
    });
    assert!(results[..2].iter().all(Result::is_ok), "{results:?}");
    for result in &results[2..] {
        assert_eq!(
            result.as_ref().unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
    }
    assert!(file.holds(0, &headers[0], &blocks[0]));
    assert!(file.holds(1, &headers[1], &blocks[1]));
}

#[test]
fn a_bad_range_mid_run_fails_its_slot_and_the_rest_are_written_alone() {
    let (headers, blocks) = run_of(6);
    let mut file = FakeFile::new();
    // Slot 3's block cannot be written; what follows can.
    file.bad = 3 * STRIDE + HEADER as u64 + 10..3 * STRIDE + HEADER as u64 + 20;
    let results = write_run_with(STRIDE, 0, &writes(&headers, &blocks), |parts, at| {
        file.pwritev(parts, at)
    });
    for (nth, result) in results.iter().enumerate() {
        assert_eq!(result.is_ok(), nth != 3, "slot {nth}: {result:?}");
        if nth != 3 {
            assert!(file.holds(nth, &headers[nth], &blocks[nth]));
        }
    }
    // The coalesced write (short, then failing), slot 3 alone (short, then
    // failing), then slots 4 and 5 alone.
    assert_eq!(file.calls, 2 + 2 + 2);
}

#[test]
fn a_run_that_fails_partway_once_is_written_again_slot_by_slot() {
    let (headers, blocks) = run_of(5);
    let mut file = FakeFile::new();
    file.flaky = 1;
    let results = write_run_with(STRIDE, 0, &writes(&headers, &blocks), |parts, at| {
        file.pwritev(parts, at)
    });
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for nth in 0..5 {
        assert!(file.holds(nth, &headers[nth], &blocks[nth]));
    }
}

#[test]
fn a_long_run_is_cut_into_writes_of_at_most_run_slots() {
    let n = RUN_SLOTS + 3;
    let headers: Vec<[u8; HEADER]> = (0..n).map(|i| [i as u8; HEADER]).collect();
    let blocks: Vec<Vec<u8>> = (0..n).map(|i| vec![!(i as u8); BLOCK]).collect();
    let mut file = FakeFile::new();
    let mut most = 0;
    let results = write_run_with(STRIDE, 0, &writes(&headers, &blocks), |parts, at| {
        most = most.max(parts.len());
        file.pwritev(parts, at)
    });
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(file.calls, 2);
    assert!(most <= 1024, "{most} buffers in one write, past IOV_MAX");
    for nth in [0, RUN_SLOTS - 1, RUN_SLOTS, n - 1] {
        assert!(file.holds(nth, &headers[nth], &blocks[nth]));
    }
}

/// A slot's bytes (header, then block) at offset `AT` of a fake file that
/// reads at most `per_call` bytes a call and fails every `eintr`-th call
/// with `EINTR`.
struct FakeReads {
    bytes: Vec<u8>,
    per_call: usize,
    eintr: usize,
    calls: usize,
}

/// Where the fake slot starts in its file.
const AT: u64 = 3 * 4096;

impl FakeReads {
    fn new(header: &[u8; HEADER], block: &[u8]) -> Self {
        let mut bytes = vec![0xee; AT as usize];
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(block);
        Self {
            bytes,
            per_call: usize::MAX,
            eintr: 0,
            calls: 0,
        }
    }

    fn preadv(&mut self, parts: &mut [IoSliceMut<'_>], at: u64) -> io::Result<usize> {
        self.calls += 1;
        if self.eintr > 0 && self.calls.is_multiple_of(self.eintr) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let mut from = at as usize;
        let mut budget = self.per_call;
        let mut read = 0;
        for part in parts.iter_mut() {
            let available = self.bytes.len().saturating_sub(from);
            let n = part.len().min(available).min(budget);
            part[..n].copy_from_slice(&self.bytes[from..from + n]);
            (from, budget, read) = (from + n, budget - n, read + n);
            if n < part.len() {
                break;
            }
        }
        Ok(read)
    }
}

/// A block of `len` bytes that differ from piece to piece.
fn block_of(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4099) as u8).collect()
}

/// Reads the fake slot: its header, its block and (with `sum`) checksum.
fn read_fake(
    file: &mut FakeReads,
    len: usize,
    sum: Option<u128>,
) -> io::Result<([u8; HEADER], Vec<u8>, Option<Checksum>)> {
    let mut header = [0u8; HEADER];
    let mut block = vec![0u8; len];
    let checksum = read_slot_with(AT, Some(&mut header), &mut block, sum, |parts, at| {
        file.preadv(parts, at)
    })?;
    Ok((header, block, checksum))
}

#[test]
fn a_verified_read_hashes_the_whole_block_in_pieces_of_read_chunk() {
    let header = [0x42; HEADER];
    for len in [
        1,
        4096,
        READ_CHUNK - 1,
        READ_CHUNK,
        READ_CHUNK + 1,
        3 * READ_CHUNK + 77,
    ] {
        let block = block_of(len);
        let mut file = FakeReads::new(&header, &block);
        let (got_header, got, sum) = read_fake(&mut file, len, Some(9)).unwrap();
        assert_eq!((got_header, &got), (header, &block), "{len} bytes");
        assert_eq!(sum, Some(Checksum::of(9, &block)), "{len} bytes");
        assert_eq!(file.calls, len.div_ceil(READ_CHUNK), "{len} bytes");

        // Unverified: header and block in one read, no checksum.
        let mut file = FakeReads::new(&header, &block);
        let (_, got, sum) = read_fake(&mut file, len, None).unwrap();
        assert_eq!((got, sum, file.calls), (block, None, 1), "{len} bytes");
    }
}

#[test]
fn short_and_interrupted_reads_are_finished_and_hash_the_same() {
    let header = [7; HEADER];
    let len = 2 * READ_CHUNK + 1000;
    let block = block_of(len);
    for (per_call, eintr) in [(1000, 0), (4096, 3), (READ_CHUNK - 1, 2), (HEADER + 1, 5)] {
        let mut file = FakeReads::new(&header, &block);
        (file.per_call, file.eintr) = (per_call, eintr);
        let (got_header, got, sum) = read_fake(&mut file, len, Some(u128::MAX)).unwrap();
        assert_eq!((got_header, &got), (header, &block));
        assert_eq!(sum, Some(Checksum::of(u128::MAX, &block)));
        assert!(
            file.calls > 3,
            "{per_call} bytes a call read in {} calls",
            file.calls
        );
    }
}

#[test]
fn a_verified_read_catches_a_changed_byte_in_any_piece() {
    let header = [1; HEADER];
    let len = 3 * READ_CHUNK + 5;
    let block = block_of(len);
    let sum = Checksum::of(5, &block);
    for at in [0, READ_CHUNK - 1, READ_CHUNK, 2 * READ_CHUNK + 17, len - 1] {
        let mut rotten = block.clone();
        rotten[at] ^= 0x10;
        let mut file = FakeReads::new(&header, &rotten);
        let (_, got, read_sum) = read_fake(&mut file, len, Some(5)).unwrap();
        assert_eq!(got, rotten);
        assert_ne!(read_sum, Some(sum), "a flip at byte {at} was not caught");
    }
    // The same bytes as another block's: another checksum.
    let mut file = FakeReads::new(&header, &block);
    assert_ne!(read_fake(&mut file, len, Some(6)).unwrap().2, Some(sum));
}

#[test]
fn a_file_that_ends_inside_the_block_is_unexpected_eof_in_any_piece() {
    let header = [3; HEADER];
    let len = 2 * READ_CHUNK + 9;
    let block = block_of(len);
    for keep in [
        HEADER / 2,
        HEADER + 10,
        HEADER + READ_CHUNK,
        HEADER + len - 1,
    ] {
        let mut file = FakeReads::new(&header, &block);
        file.bytes.truncate(AT as usize + keep);
        for sum in [Some(1), None] {
            let err = read_fake(&mut file, len, sum).unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::UnexpectedEof,
                "{keep} bytes kept"
            );
        }
    }
}
