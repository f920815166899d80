//! The progress bar of long replays, on stderr.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvbm_sim::Progress;

/// A terminal progress bar that appears only once a phase has run for
/// [`Bar::DELAY`]: quick replays print nothing, slow ones show how far they are.
pub(crate) struct Bar {
    enabled: bool,
    bar: Option<ProgressBar>,
    label: String,
    total: u64,
    position: u64,
    started: Instant,
}

impl Bar {
    const DELAY: Duration = Duration::from_millis(300);

    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            bar: None,
            label: String::new(),
            total: 0,
            position: 0,
            started: Instant::now(),
        }
    }

    fn show(&self) -> ProgressBar {
        let style = ProgressStyle::with_template(
            "{msg:>10} [{bar:40}] {percent:>3}% {elapsed_precise} (eta {eta})",
        )
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        // Set up hidden, then shown, so the first frame is already right.
        let bar = ProgressBar::with_draw_target(Some(self.total), ProgressDrawTarget::hidden())
            .with_style(style)
            .with_message(self.label.clone())
            .with_position(self.position)
            .with_elapsed(self.started.elapsed());
        // stderr() hides itself when stderr is not a terminal.
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar
    }
}

impl Progress for Bar {
    fn start(&mut self, label: &str, total: u64) {
        self.finish();
        label.clone_into(&mut self.label);
        self.total = total;
        self.position = 0;
        self.started = Instant::now();
    }

    fn advance(&mut self, amount: u64) {
        self.position = self.position.saturating_add(amount);
        if self.bar.is_none() && self.enabled && self.started.elapsed() >= Self::DELAY {
            self.bar = Some(self.show());
        }
        if let Some(bar) = &self.bar {
            bar.set_position(self.position);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.finish();
    }
}
