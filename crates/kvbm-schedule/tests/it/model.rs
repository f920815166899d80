//! Model-based test: random sequences of match / schedule_* / apply_* /
//! revert / release / reacquire on two requests that share a prompt prefix
//! (and, from a tiny token alphabet, often their continuations), in a small
//! pool, against a reference model of the state machine made of plain
//! fields. After every step:
//!
//! - the result (unit, count, outcome or the exact error with its context)
//!   is the model's;
//! - each request's state, `kv_position`, `tail_tokens`, tokens and block
//!   counts (held, assigned = `kv / block_size`, unassigned, none staged)
//!   are the model's;
//! - a refused call left the pool exactly as it was and recorded no event; a
//!   successful one recorded its event;
//! - the pool conserves blocks, and what it reports as held (mutable) and
//!   active (registered and pinned) is exactly what the requests hold;
//! - registration timing: every block below a request's `kv_position` is
//!   matchable, and no block is matchable unless some request's
//!   `kv_position` has covered it (its KV was computed), so a block whose
//!   last token is a tail token is never matchable early.
//!
//! At the end both requests are released and no block is left in use.

use std::collections::BTreeSet;

use kvbm_blocks::{BlockError, BlockManager, SequenceHash};
use kvbm_schedule::{
    ApplyError, DecodeOutcome, SchedulableSequence, ScheduleError, SequenceEvent, SequenceState,
};
use kvbm_sequence::SequenceError;
use proptest::prelude::*;

use crate::{BLOCK_SIZE as BS, Gpu, audit};

const REQUESTS: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    Match(usize),
    SchedulePrefill(usize, usize),
    /// A chunk of at most this many tokens, clamped to what is left.
    SchedulePrefillRest(usize, usize),
    ApplyPrefill(usize, Option<u32>),
    /// The token exactly when the chunk emits one.
    ApplyPrefillAuto(usize, u32),
    ScheduleDecode(usize),
    ApplyDecode(usize, u32),
    ScheduleSpeculative(usize, usize),
    ApplySpeculative(usize, Vec<u32>),
    Revert(usize),
    Release(usize),
    Reacquire(usize),
    /// The next step a well-behaved engine would take: schedule a prefill
    /// chunk, decode or speculative step, or apply the pending one
    /// (accepting `accept` of the drafts).
    Advance {
        req: usize,
        token: u32,
        chunk: usize,
        drafts: Vec<u32>,
        speculative: bool,
        accept: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let req = 0..REQUESTS;
    let token = 0u32..3;
    prop_oneof![
        3 => req.clone().prop_map(Op::Match),
        1 => (req.clone(), 0usize..10).prop_map(|(r, n)| Op::SchedulePrefill(r, n)),
        2 => (req.clone(), 1usize..7).prop_map(|(r, n)| Op::SchedulePrefillRest(r, n)),
        1 => (req.clone(), proptest::option::of(token.clone())).prop_map(|(r, t)| Op::ApplyPrefill(r, t)),
        2 => (req.clone(), token.clone()).prop_map(|(r, t)| Op::ApplyPrefillAuto(r, t)),
        2 => req.clone().prop_map(Op::ScheduleDecode),
        2 => (req.clone(), token.clone()).prop_map(|(r, t)| Op::ApplyDecode(r, t)),
        2 => (req.clone(), 0usize..6).prop_map(|(r, n)| Op::ScheduleSpeculative(r, n)),
        2 => (req.clone(), prop::collection::vec(token.clone(), 0..6)).prop_map(|(r, t)| Op::ApplySpeculative(r, t)),
        1 => req.clone().prop_map(Op::Revert),
        2 => req.clone().prop_map(Op::Release),
        3 => req.clone().prop_map(Op::Reacquire),
        24 => (req, token.clone(), 1usize..7, prop::collection::vec(token, 0..6), any::<bool>(), 0usize..7)
            .prop_map(|(req, token, chunk, drafts, speculative, accept)| Op::Advance {
                req, token, chunk, drafts, speculative, accept,
            }),
    ]
}

/// What a call returned, normalized so model and implementation compare.
#[derive(Debug, PartialEq)]
enum Res {
    Unit,
    Count(usize),
    Outcome(DecodeOutcome),
    Schedule(ScheduleError),
    Apply(ApplyError),
}

impl Res {
    fn is_err(&self) -> bool {
        matches!(self, Res::Schedule(_) | Res::Apply(_))
    }
}

fn unit<E>(r: Result<(), E>, wrap: fn(E) -> Res) -> Res {
    r.map_or_else(wrap, |()| Res::Unit)
}

/// The reference model of one request: plain fields.
#[derive(Clone, Debug)]
struct Model {
    state: SequenceState,
    kv: usize,
    tokens: Vec<u32>,
    num_input: usize,
    max_output: usize,
    held: usize,
}

impl Model {
    fn total(&self) -> usize {
        self.tokens.len()
    }
    fn generated(&self) -> usize {
        self.total() - self.num_input
    }
    fn target(&self) -> usize {
        if self.generated() == 0 {
            self.num_input
        } else {
            self.total() - 1
        }
    }
    fn blocks_for(tokens: usize) -> usize {
        tokens.div_ceil(BS)
    }

    /// Allocation of `needed` blocks against the pool's `available` count
    /// (`total` blocks in all), as the block layer decides it.
    fn allocate(&mut self, needed: usize, available: usize, total: usize) -> Result<usize, Res> {
        if needed == 0 || needed <= available {
            self.held += needed;
            return Ok(needed);
        }
        let (block_error, reported) = if needed > total {
            (
                BlockError::ExceedsCapacity {
                    requested: needed,
                    total,
                },
                available,
            )
        } else {
            (
                BlockError::InsufficientBlocks {
                    requested: needed,
                    available,
                },
                available,
            )
        };
        Err(Res::Schedule(ScheduleError::AllocationFailed {
            requested: needed,
            available: reported,
            source: SequenceError::AllocationFailed {
                requested: needed,
                source: block_error,
            },
        }))
    }

    fn decode_preconditions(&self, operation: &'static str) -> Result<(), Res> {
        if !self.state.is_idle() {
            return Err(Res::Schedule(ScheduleError::NotIdle {
                operation,
                state: self.state,
            }));
        }
        if self.kv < self.target() {
            return Err(Res::Schedule(ScheduleError::PrefillNotComplete {
                kv_position: self.kv,
                prefill_target: self.target(),
            }));
        }
        if self.generated() >= self.max_output {
            return Err(Res::Schedule(ScheduleError::GenerationComplete {
                generated_tokens: self.generated(),
                max_output_tokens: self.max_output,
            }));
        }
        if self.total() - self.kv != 1 {
            return Err(Res::Schedule(ScheduleError::WrongDanglingCount {
                expected: 1,
                actual: self.total() - self.kv,
            }));
        }
        Ok(())
    }

    /// The capped prefix match, given which of the request's block hashes
    /// are registered. Returns (matched, unassigned blocks dropped).
    fn match_capped(&mut self, present: &[bool]) -> (usize, usize) {
        let from = self.kv / BS;
        let cap = self.total().saturating_sub(1) / BS;
        if cap <= from {
            return (0, 0);
        }
        let matched = present[from..cap].iter().take_while(|&&p| p).count();
        if matched == 0 {
            return (0, 0);
        }
        let dropped = self.held - from;
        self.held = from + matched;
        self.kv = (from + matched) * BS;
        (matched, dropped)
    }

    fn wrong_state(&self, operation: &'static str, expected: &'static str) -> Res {
        Res::Apply(ApplyError::WrongState {
            operation,
            expected,
            actual: self.state,
        })
    }

    /// Applies `op` to the model; returns the expected result and how many
    /// events it records.
    fn step(&mut self, op: &Op, present: &[bool], available: usize, pool: usize) -> (Res, u64) {
        let result = self.step_inner(op, present, available, pool);
        match result {
            Ok((res, events)) => (res, events),
            Err(res) => (res, 0),
        }
    }

    fn step_inner(
        &mut self,
        op: &Op,
        present: &[bool],
        available: usize,
        pool: usize,
    ) -> Result<(Res, u64), Res> {
        let idle = |m: &Self, operation| {
            if m.state.is_idle() {
                Ok(())
            } else {
                Err(Res::Schedule(ScheduleError::NotIdle {
                    operation,
                    state: m.state,
                }))
            }
        };
        match op {
            Op::Match(_) => {
                idle(self, "match_and_add_prefix")?;
                let (matched, dropped) = self.match_capped(present);
                Ok((Res::Count(matched), 1 + u64::from(dropped > 0)))
            }
            Op::Reacquire(_) => {
                idle(self, "reacquire")?;
                if self.held > 0 {
                    return Err(Res::Schedule(ScheduleError::NotReleased {
                        held: self.held,
                    }));
                }
                let (matched, dropped) = self.match_capped(present);
                assert_eq!(dropped, 0);
                Ok((Res::Count(matched), 1))
            }
            Op::SchedulePrefill(_, n) | Op::SchedulePrefillRest(_, n) => {
                idle(self, "schedule_prefill")?;
                let (kv, target) = (self.kv, self.target());
                if kv >= target {
                    return Err(Res::Schedule(ScheduleError::PrefillComplete {
                        kv_position: kv,
                        prefill_target: target,
                    }));
                }
                if kv + n > target {
                    return Err(Res::Schedule(ScheduleError::PrefillOverrun {
                        kv_position: kv,
                        num_tokens: *n,
                        prefill_target: target,
                    }));
                }
                let needed = Self::blocks_for(kv + n).saturating_sub(self.held);
                let allocated = self.allocate(needed, available, pool)?;
                self.state = SequenceState::PrefillScheduled {
                    num_tokens: *n,
                    blocks_allocated: allocated,
                };
                Ok((Res::Unit, 1))
            }
            Op::ApplyPrefill(_, token) => self.apply_prefill(*token),
            Op::ApplyPrefillAuto(..) | Op::Advance { .. } => {
                unreachable!("resolved before stepping")
            }
            Op::ScheduleDecode(_) => {
                self.decode_preconditions("schedule_decode")?;
                let needed = Self::blocks_for(self.total()).saturating_sub(self.held);
                let allocated = self.allocate(needed, available, pool)?;
                self.state = SequenceState::DecodeScheduled {
                    blocks_allocated: allocated,
                };
                Ok((Res::Unit, 1))
            }
            Op::ApplyDecode(_, token) => {
                if !matches!(self.state, SequenceState::DecodeScheduled { .. }) {
                    return Err(self.wrong_state("apply_decode", "DecodeScheduled"));
                }
                self.kv += 1;
                self.tokens.push(*token);
                self.state = SequenceState::Idle;
                let completed = self.total().is_multiple_of(BS);
                let max = self.generated() >= self.max_output;
                Ok((Res::Outcome(DecodeOutcome::new(completed, max)), 1))
            }
            Op::ScheduleSpeculative(_, n) => {
                self.decode_preconditions("schedule_speculative")?;
                let n = (*n).min(self.max_output - self.generated());
                let needed = Self::blocks_for(self.total() + n).saturating_sub(self.held);
                let allocated = self.allocate(needed, available, pool)?;
                self.state = SequenceState::SpeculativeScheduled {
                    num_tokens: n,
                    blocks_allocated: allocated,
                };
                Ok((Res::Unit, 1))
            }
            Op::ApplySpeculative(_, accepted) => {
                let SequenceState::SpeculativeScheduled { num_tokens, .. } = self.state else {
                    return Err(self.wrong_state("apply_speculative", "SpeculativeScheduled"));
                };
                if accepted.len() > num_tokens {
                    return Err(Res::Apply(ApplyError::AcceptedExceedsScheduled {
                        accepted: accepted.len(),
                        scheduled: num_tokens,
                    }));
                }
                let old_total = self.total();
                self.tokens.extend_from_slice(accepted);
                self.kv += accepted.len();
                let keep = Self::blocks_for(self.total());
                assert!(
                    self.held >= keep,
                    "the schedule covered every accepted token"
                );
                self.held = keep;
                self.state = SequenceState::Idle;
                let completed = self.total() / BS > old_total / BS;
                let max = self.generated() >= self.max_output;
                Ok((Res::Outcome(DecodeOutcome::new(completed, max)), 1))
            }
            Op::Revert(_) => {
                if self.state.is_idle() {
                    return Err(self.wrong_state("revert_schedule", "a scheduled state"));
                }
                self.held -= self.state.blocks_allocated();
                self.state = SequenceState::Idle;
                Ok((Res::Unit, 1))
            }
            Op::Release(_) => {
                if !self.state.is_idle() {
                    return Err(self.wrong_state("release", "Idle"));
                }
                self.held = 0;
                self.kv = 0;
                Ok((Res::Unit, 1))
            }
        }
    }

    fn apply_prefill(&mut self, token: Option<u32>) -> Result<(Res, u64), Res> {
        let SequenceState::PrefillScheduled { num_tokens, .. } = self.state else {
            return Err(self.wrong_state("apply_prefill", "PrefillScheduled"));
        };
        let end = self.kv + num_tokens;
        let target = self.target();
        let emits = end >= target && self.generated() == 0 && self.max_output > 0;
        match (token, emits) {
            (Some(_), false) => {
                return Err(Res::Apply(ApplyError::TokenOnNonFinalChunk {
                    chunk_end: end,
                    prefill_target: target,
                    generated_tokens: self.generated(),
                    max_output_tokens: self.max_output,
                }));
            }
            (None, true) => {
                return Err(Res::Apply(ApplyError::MissingTokenOnFinalChunk {
                    prefill_target: target,
                }));
            }
            _ => {}
        }
        self.kv = end;
        self.tokens.extend(token);
        self.state = SequenceState::Idle;
        Ok((Res::Unit, 1))
    }

    /// Turns the "do the right thing" ops into concrete ones.
    fn resolve(&self, op: Op) -> Op {
        match op {
            Op::SchedulePrefillRest(r, chunk) => {
                Op::SchedulePrefillRest(r, chunk.min(self.target().saturating_sub(self.kv)))
            }
            Op::ApplyPrefillAuto(r, token) => {
                let emits = match self.state {
                    SequenceState::PrefillScheduled { num_tokens, .. } => {
                        self.kv + num_tokens >= self.target()
                            && self.generated() == 0
                            && self.max_output > 0
                    }
                    _ => false,
                };
                Op::ApplyPrefill(r, emits.then_some(token))
            }
            Op::Advance {
                req,
                token,
                chunk,
                drafts,
                speculative,
                accept,
            } => match self.state {
                SequenceState::Idle if self.kv < self.target() => {
                    Op::SchedulePrefillRest(req, chunk.min(self.target() - self.kv))
                }
                SequenceState::Idle if speculative => Op::ScheduleSpeculative(req, drafts.len()),
                SequenceState::Idle => Op::ScheduleDecode(req),
                SequenceState::PrefillScheduled { .. } => {
                    self.resolve(Op::ApplyPrefillAuto(req, token))
                }
                SequenceState::DecodeScheduled { .. } => Op::ApplyDecode(req, token),
                SequenceState::SpeculativeScheduled { num_tokens, .. } => {
                    let take = accept.min(num_tokens).min(drafts.len());
                    Op::ApplySpeculative(req, drafts[..take].to_vec())
                }
                state => unimplemented!("the model has no {state:?}"),
            },
            other => other,
        }
    }
}

fn request_of(op: &Op) -> usize {
    match *op {
        Op::Match(r)
        | Op::SchedulePrefill(r, _)
        | Op::SchedulePrefillRest(r, _)
        | Op::ApplyPrefill(r, _)
        | Op::ApplyPrefillAuto(r, _)
        | Op::ScheduleDecode(r)
        | Op::ApplyDecode(r, _)
        | Op::ScheduleSpeculative(r, _)
        | Op::ApplySpeculative(r, _)
        | Op::Revert(r)
        | Op::Release(r)
        | Op::Reacquire(r)
        | Op::Advance { req: r, .. } => r,
    }
}

fn run(seq: &mut SchedulableSequence<Gpu>, op: &Op, m: &BlockManager<Gpu>) -> Res {
    let count = |r: Result<usize, ScheduleError>| r.map_or_else(Res::Schedule, Res::Count);
    let outcome = |r: Result<DecodeOutcome, ApplyError>| r.map_or_else(Res::Apply, Res::Outcome);
    match op {
        Op::Match(_) => count(seq.match_and_add_prefix(m)),
        Op::Reacquire(_) => count(seq.reacquire(m)),
        Op::SchedulePrefill(_, n) | Op::SchedulePrefillRest(_, n) => {
            unit(seq.schedule_prefill(*n, m), Res::Schedule)
        }
        Op::ApplyPrefill(_, token) => unit(seq.apply_prefill(*token, m), Res::Apply),
        Op::ApplyPrefillAuto(..) | Op::Advance { .. } => unreachable!("resolved before running"),
        Op::ScheduleDecode(_) => unit(seq.schedule_decode(m), Res::Schedule),
        Op::ApplyDecode(_, token) => outcome(seq.apply_decode(*token, m)),
        Op::ScheduleSpeculative(_, n) => unit(seq.schedule_speculative(*n, m), Res::Schedule),
        Op::ApplySpeculative(_, accepted) => outcome(seq.apply_speculative(accepted, m)),
        Op::Revert(_) => unit(seq.revert_schedule(), Res::Apply),
        Op::Release(_) => unit(seq.release(), Res::Apply),
    }
}

/// The event a successful `op` records last.
fn event_matches(op: &Op, event: Option<&SequenceEvent>) -> bool {
    use SequenceEvent as E;
    matches!(
        (op, event),
        (Op::Match(_), Some(E::PrefixMatched { .. }))
            | (Op::Reacquire(_), Some(E::Reacquired { .. }))
            | (
                Op::SchedulePrefill(..) | Op::SchedulePrefillRest(..),
                Some(E::PrefillScheduled { .. })
            )
            | (Op::ApplyPrefill(..), Some(E::PrefillApplied { .. }))
            | (Op::ScheduleDecode(_), Some(E::DecodeScheduled { .. }))
            | (Op::ApplyDecode(..), Some(E::DecodeApplied { .. }))
            | (
                Op::ScheduleSpeculative(..),
                Some(E::SpeculativeScheduled { .. })
            )
            | (Op::ApplySpeculative(..), Some(E::SpeculativeApplied { .. }))
            | (Op::Revert(_), Some(E::ScheduleReverted { .. }))
            | (Op::Release(_), Some(E::Released { .. }))
    )
}

fn hashes(seq: &SchedulableSequence<Gpu>) -> &[SequenceHash] {
    seq.inner().sequence().sequence_hashes()
}

/// Checks every request against its model, the pool's conservation and the
/// registration-timing invariant.
fn check_all(
    seqs: &[SchedulableSequence<Gpu>],
    models: &[Model],
    m: &BlockManager<Gpu>,
    computed: &mut BTreeSet<u128>,
) -> Result<(), TestCaseError> {
    let mut mutable = 0;
    let mut active = BTreeSet::new();
    for (i, (seq, model)) in seqs.iter().zip(models).enumerate() {
        prop_assert_eq!(seq.state(), model.state, "request {}", i);
        prop_assert_eq!(seq.kv_position(), model.kv, "request {}", i);
        prop_assert_eq!(seq.tail_tokens(), model.total() - model.kv, "request {}", i);
        prop_assert_eq!(seq.tokens(), &model.tokens[..], "request {}", i);
        prop_assert_eq!(seq.held_blocks(), model.held, "request {}", i);
        prop_assert_eq!(seq.assigned_blocks(), model.kv / BS, "request {}", i);
        prop_assert_eq!(seq.staged_blocks(), 0, "request {}", i);
        prop_assert_eq!(
            seq.unassigned_blocks(),
            model.held - model.kv / BS,
            "request {}",
            i
        );
        prop_assert_eq!(seq.is_prefill_complete(), model.kv >= model.target());
        mutable += seq.unassigned_blocks() + seq.staged_blocks();
        active.extend(seq.inner().assignments().assigned().block_ids());
        // KV computed: below kv_position, every block is (now) registered.
        let covered = &hashes(seq)[..model.kv / BS];
        computed.extend(covered.iter().map(|h| h.value()));
        prop_assert!(
            m.scan_matches(covered).iter().all(|&p| p),
            "request {}: a computed block is not matchable",
            i
        );
    }
    for seq in seqs {
        let all = hashes(seq);
        for (hash, present) in all.iter().zip(m.scan_matches(all)) {
            prop_assert!(
                !present || computed.contains(&hash.value()),
                "block {:?} is matchable but no request ever computed its KV",
                hash
            );
        }
    }
    let audit = audit(m);
    prop_assert_eq!(audit.held_blocks, mutable, "{:?}", audit);
    prop_assert_eq!(audit.active_blocks, active.len(), "{:?}", audit);
    prop_assert_eq!(audit.duplicate_blocks, 0);
    Ok(())
}

fn scenario() -> impl Strategy<Value = (Vec<u32>, usize, Vec<u32>, [usize; 2], usize)> {
    (
        prop::collection::vec(0u32..3, 0..14),
        0usize..14,
        prop::collection::vec(0u32..3, 0..6),
        [0usize..12, 0usize..12],
        3usize..14,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn random_schedules_follow_the_reference_model(
        (base, shared, suffix, max_output, pool) in scenario(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let m = crate::manager(pool);
        let shared = shared.min(base.len());
        let prompts = [base.clone(), [&base[..shared], &suffix[..]].concat()];
        let mut seqs: Vec<SchedulableSequence<Gpu>> = prompts
            .iter()
            .zip(max_output)
            .map(|(p, max)| SchedulableSequence::new(p.clone(), max, BS).unwrap())
            .collect();
        let mut models: Vec<Model> = prompts
            .iter()
            .zip(max_output)
            .map(|(p, max)| Model {
                state: SequenceState::Idle,
                kv: 0,
                tokens: p.clone(),
                num_input: p.len(),
                max_output: max,
                held: 0,
            })
            .collect();
        let mut computed = BTreeSet::new();

        for op in ops {
            let r = request_of(&op);
            let op = models[r].resolve(op);
            let present = m.scan_matches(hashes(&seqs[r]));
            let available = m.available_blocks();
            let before = audit(&m);
            let recorded = seqs[r].history().recorded();

            let (expected, events) = models[r].step(&op, &present, available, pool);
            let actual = run(&mut seqs[r], &op, &m);
            prop_assert_eq!(&actual, &expected, "op {:?}", op);
            prop_assert_eq!(seqs[r].history().recorded() - recorded, events, "op {:?}", op);
            if actual.is_err() {
                prop_assert_eq!(audit(&m), before, "a refused {:?} touched the pool", op);
            } else {
                prop_assert!(event_matches(&op, seqs[r].history().last()), "op {:?}", op);
            }
            check_all(&seqs, &models, &m, &mut computed)?;
        }

        for seq in &mut seqs {
            if !seq.state().is_idle() {
                seq.revert_schedule().unwrap();
            }
            seq.release().unwrap();
        }
        let audit = audit(&m);
        prop_assert_eq!(audit.in_use_blocks(), 0, "{:?}", audit);
    }
}
