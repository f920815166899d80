//! The queue reports enqueue, dequeue, remove, cancel, close, select (and
//! restore, clear) as `tracing` events.
//!
//! This is its own test binary, with one test, on purpose: tracing caches each
//! callsite's interest process-wide when the callsite is first hit, and a
//! first hit on a parallel test thread (which has no subscriber) can race the
//! scoped subscriber installed here and cache "never" for our callsites.

use std::sync::{Arc, Mutex};

use kvbm_queue::{Priority, QueueError};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

use kvbm_queue::{QueueConfig, Request, RequestQueue};

struct Req(u32);

impl Request for Req {
    type Id = u32;
    fn id(&self) -> u32 {
        self.0
    }
    fn prompt_tokens(&self) -> u32 {
        16
    }
    fn max_new_tokens(&self) -> u32 {
        0
    }
}

fn req(id: u32, _: Priority) -> Req {
    Req(id)
}

/// Records the message of every event; spans are not used by the queue.
#[derive(Default)]
struct Recorder {
    messages: Arc<Mutex<Vec<String>>>,
}

struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Recorder {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Ask per event: other test threads run without a subscriber.
        Interest::sometimes()
    }
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        if let Ok(mut messages) = self.messages.lock() {
            messages.push(message);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn every_operation() -> Result<(), QueueError> {
    let q = RequestQueue::new(QueueConfig::new(16, 8))?;
    let ticket = q.enqueue(req(1, Priority::Normal))?;
    q.enqueue(req(2, Priority::Normal))?;
    q.enqueue(req(3, Priority::Normal))?;
    q.try_dequeue()?;
    q.remove(2);
    q.cancel(ticket);
    for admitted in q.select_batch(1, 8) {
        q.restore(admitted).map_err(QueueError::from)?;
    }
    q.clear();
    q.close();
    let _ = q.enqueue(req(4, Priority::Normal));
    let _ = q.try_dequeue();
    Ok(())
}

#[test]
fn every_operation_emits_an_event() -> Result<(), QueueError> {
    let recorder = Recorder::default();
    let messages = Arc::clone(&recorder.messages);
    tracing::subscriber::with_default(recorder, every_operation)?;
    let messages = messages.lock().map(|m| m.clone()).unwrap_or_default();
    assert_eq!(
        messages,
        [
            "enqueued",
            "enqueued",
            "enqueued",
            "dequeued",
            "removed",
            "cancelled",
            "selected",
            "restored",
            "cleared",
            "closed",
            "enqueue refused: closed",
            "dequeue returned empty-handed",
        ]
    );
    Ok(())
}
