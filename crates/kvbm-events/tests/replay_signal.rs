//! The replay thread survives a signal with a handler (issue 21, item 5):
//! such a signal interrupts its `zmq_poll` with `EINTR` (a process with a
//! SIGTERM handler, or a sampling profiler, sees many), which used to end
//! the thread and leave the ROUTER bound with nobody answering.
//!
//! No test harness: the signal is sent to the process, and the kernel gives
//! it to a thread that does not mask it. libzmq's own threads mask every
//! signal; `main` masks SIGUSR1 after the publisher's replay thread has
//! started (threads inherit the mask at creation), so only the replay
//! thread can take it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kvbm_events::{KvEvent, KvEventBatch, Publisher, PublisherConfig};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask};
use nix::unistd::Pid;

fn main() {
    // The handler only counts (and makes the signal interrupt, not kill).
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&handled);
    signal_hook::flag::register_usize(signal_hook::consts::SIGUSR1, counter, 1)
        .expect("handler installed");

    let config = PublisherConfig::new("tcp://127.0.0.1:*").with_replay("tcp://127.0.0.1:*");
    let mut publisher = Publisher::new(&config).expect("loopback endpoints bind");
    publisher
        .publish(&KvEventBatch::new(0.0, vec![KvEvent::AllBlocksCleared]))
        .expect("published");

    let mut usr1 = SigSet::empty();
    usr1.add(Signal::SIGUSR1);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&usr1), None).expect("masked in main");

    // The replay thread polls in 50 ms slices: signals 10 ms apart land in
    // its polls, whichever state it is in.
    let started = Instant::now();
    for _ in 0..30 {
        kill(Pid::this(), Signal::SIGUSR1).expect("signal sent");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Each signal is handled once; pending ones merge, so wait for at least
    // one and check it was not taken by main (which masks it).
    while handled.load(Ordering::Relaxed) == 0 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        handled.load(Ordering::Relaxed) > 0,
        "the replay thread took the signals"
    );

    // It still answers.
    let context = zmq::Context::new();
    let dealer = context.socket(zmq::DEALER).unwrap();
    dealer.set_rcvtimeo(5_000).unwrap();
    dealer
        .connect(publisher.replay_endpoint().unwrap())
        .unwrap();
    dealer
        .send_multipart([&b""[..], &0u64.to_be_bytes()[..]], 0)
        .unwrap();
    let answer = dealer
        .recv_multipart(0)
        .expect("the replay thread answers after the signals");
    assert_eq!(answer[2], 0u64.to_be_bytes());
    let end = dealer.recv_multipart(0).expect("the end marker");
    assert_eq!(end[2], (-1i64).to_be_bytes());
    eprintln!(
        "replay_signal: ok ({} signals handled)",
        handled.load(Ordering::Relaxed)
    );
}
