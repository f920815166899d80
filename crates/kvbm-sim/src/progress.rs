//! [`Progress`]: how long-running loads and replays report how far they are.
//!
//! The library draws nothing itself; the `kvbm-sim` binary plugs a terminal
//! progress bar in, tests and benches pass [`NoProgress`].

/// Receives progress of one phase at a time: `start`, any number of
/// `advance`s, then `finish`.
///
/// Callers report in batches (every few hundred requests or a quarter
/// megabyte), so implementations may do real work per call.
pub trait Progress {
    /// A phase begins: `label` says what runs, `total` is the amount of work
    /// in the unit `advance` counts (requests, bytes).
    fn start(&mut self, label: &str, total: u64);
    /// `amount` more units are done.
    fn advance(&mut self, amount: u64);
    /// The phase is over.
    fn finish(&mut self);
}

/// Reports nowhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _label: &str, _total: u64) {}
    fn advance(&mut self, _amount: u64) {}
    fn finish(&mut self) {}
}

/// Forwards the advances of each run of a sweep into the sweep's one
/// progress phase (the runs' own starts and finishes are not shown).
pub(crate) struct Nested<'a>(pub(crate) &'a mut dyn Progress);

impl Progress for Nested<'_> {
    fn start(&mut self, _label: &str, _total: u64) {}
    fn advance(&mut self, amount: u64) {
        self.0.advance(amount);
    }
    fn finish(&mut self) {}
}
