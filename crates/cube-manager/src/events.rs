//! The event broker: every change of the manager's state as a numbered event, kept for a
//! while and handed to whoever follows (`GET /events`, and the blocking queries of
//! `GET /tasks`, `/jobs` and `/nodes`).
//!
//! An event is published under the manager's state lock, where its change is applied to the
//! cache (`Cluster::save`, the node registry, the job records), so events come in the order of
//! the changes. Publishing numbers the event, keeps it in a bounded window (the last
//! [`WINDOW`] events) and sends it on a tokio `broadcast` channel of [`CHANNEL`] slots: a
//! send never waits for a receiver, and a receiver that falls more than the channel behind
//! learns it lagged, and its stream ends with a `Dropped` notice that says where to resume.
//! **Publishing never waits on a subscriber.**
//!
//! Indexes grow by one per event and never repeat across restarts: the manager keeps an epoch
//! in its store (`meta` table), bumps it durably at each start, and numbers the events of
//! epoch E from E × [`EPOCH_SPAN`]. (With the memory store the epoch starts at 1 every time,
//! as everything else does.)
//!
//! An event is published before the write behind it is durable, like the cache it mirrors
//! (`Cluster::save`): a write that fails puts the store's version back, and that is one more
//! event. A task's event holds the task behind the cache's own `Arc`, so publishing one costs
//! a reference count, and is written as JSON once, by the first subscriber that sends it.
//!
//! This module knows no HTTP: the framing of `GET /events` (lines or server-sent events), its
//! heartbeat and its end are in `event_stream.rs`.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use cube_types::Task;
use cube_types::job::JobRecord;
use serde::ser::{Serialize, Serializer};
use tokio::sync::broadcast;

use crate::cache::holds_resources;

/// How many indexes one epoch (one start of the manager) may use: events of epoch E are
/// numbered from E × 10^12 on.
pub const EPOCH_SPAN: u64 = 1_000_000_000_000;

/// How many of the last events are kept, for subscribers that resume with `?index=N`.
pub const WINDOW: usize = 10_000;

/// How many events a subscriber may fall behind before it is dropped (the broadcast
/// channel's slots, shared by every subscriber: they hold the same `Arc`s as the window).
pub const CHANNEL: usize = 4096;

/// What an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    Task,
    Job,
    Node,
    Deployment,
    /// The waiting list's entries.
    Queue,
    /// Projects and their quotas.
    Project,
    /// A request that starts (`QuotaWaiting`) or stops (`QuotaAdmitted`) waiting for its
    /// project's quota.
    Quota,
    /// A route's backends, host or port changed (`routes.rs`): `Added`, `Updated`,
    /// `Removed`.
    Route,
}

impl Topic {
    pub const ALL: [Topic; 8] = [
        Topic::Task,
        Topic::Job,
        Topic::Node,
        Topic::Deployment,
        Topic::Queue,
        Topic::Project,
        Topic::Quota,
        Topic::Route,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topic::Task => "Task",
            Topic::Job => "Job",
            Topic::Node => "Node",
            Topic::Deployment => "Deployment",
            Topic::Queue => "Queue",
            Topic::Project => "Project",
            Topic::Quota => "Quota",
            Topic::Route => "Route",
        }
    }

    /// A topic by its name, in any case (`task`, `Task`).
    pub fn parse(text: &str) -> Option<Topic> {
        Topic::ALL
            .into_iter()
            .find(|topic| topic.name().eq_ignore_ascii_case(text))
    }
}

impl std::fmt::Display for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an event carries as its `Object`.
pub(crate) enum Payload {
    /// Any object, as given to [`Cluster::publish`]; kept as [`Payload::Text`].
    Value(serde_json::Value),
    /// A task, the cache's own; written without its `History`.
    Task(Arc<Task>),
    /// An object as its JSON text: what the window keeps of a [`Payload::Value`]. A node's
    /// report as a tree of `serde_json::Value`s took three times its text, 14 MB of 10,000
    /// nodes' events in every manager at 2,000 workers (BENCHMARKS.md).
    Text(Box<serde_json::value::RawValue>),
}

impl Payload {
    /// The payload as the window keeps it: an object as its text.
    fn kept(self) -> Payload {
        match self {
            Payload::Value(value) => match serde_json::value::to_raw_value(&value) {
                Ok(text) => Payload::Text(text),
                // A map whose keys are not strings cannot be written; none is published.
                Err(_) => Payload::Value(value),
            },
            other => other,
        }
    }
}

/// One change of the manager's state.
pub struct Event {
    pub index: u64,
    pub time: DateTime<Utc>,
    pub topic: Topic,
    /// The event's `Type`: for a task, the newest history entry the change added
    /// (`Submitted`, `Placed`, `Running`, ...), or `Updated`.
    pub kind: Cow<'static, str>,
    /// The task's ID, the node's or the job's name.
    pub key: String,
    /// The job the object belongs to, if any.
    pub job: Option<String>,
    /// The project the object belongs to; `None` for what is cluster-wide (a node), which
    /// every token that may read events sees.
    pub project: Option<String>,
    /// Whether the change moved what a node holds (a task placed, or one that ended): what
    /// wakes a blocking `GET /nodes`. Not written.
    pub allocation: bool,
    payload: Payload,
    /// The event as one line of JSON (no newline), written once, when first sent.
    json: OnceLock<Bytes>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("index", &self.index)
            .field("topic", &self.topic)
            .field("kind", &self.kind)
            .field("key", &self.key)
            .field("job", &self.job)
            .finish()
    }
}

impl Event {
    /// `{"Index", "Time", "Topic", "Type", "Key", "Job", "Object"}` as one line, without its
    /// newline; written the first time it is asked for and kept.
    pub fn json(&self) -> &Bytes {
        self.json.get_or_init(|| match serde_json::to_vec(self) {
            Ok(json) => Bytes::from(json),
            // Only a map with keys that are not strings fails, and no object here has one;
            // should it happen, the event still says what it is.
            Err(err) => Bytes::from(
                serde_json::json!({
                    "Index": self.index, "Time": self.time, "Topic": self.topic.name(),
                    "Type": self.kind, "Key": self.key,
                    "Message": format!("the object cannot be written: {err}"),
                })
                .to_string(),
            ),
        })
    }
}

/// An event as it is written, from references.
#[derive(serde::Serialize)]
struct EventWire<'a, O: Serialize> {
    #[serde(rename = "Index")]
    index: u64,
    #[serde(rename = "Time")]
    time: &'a DateTime<Utc>,
    #[serde(rename = "Topic")]
    topic: &'static str,
    #[serde(rename = "Type")]
    kind: &'a str,
    #[serde(rename = "Key")]
    key: &'a str,
    #[serde(rename = "Job", skip_serializing_if = "Option::is_none")]
    job: Option<&'a str>,
    #[serde(rename = "Project", skip_serializing_if = "Option::is_none")]
    project: Option<&'a str>,
    #[serde(rename = "Object")]
    object: O,
}

impl Event {
    fn wire<O: Serialize>(&self, object: O) -> EventWire<'_, O> {
        EventWire {
            index: self.index,
            time: &self.time,
            topic: self.topic.name(),
            kind: &self.kind,
            key: &self.key,
            job: self.job.as_deref(),
            project: self.project.as_deref(),
            object,
        }
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.payload {
            Payload::Value(value) => self.wire(value).serialize(serializer),
            Payload::Task(task) => self.wire(task.without_history()).serialize(serializer),
            Payload::Text(text) => self.wire(text).serialize(serializer),
        }
    }
}

/// A notice about the stream itself, its last line: `Dropped` (the subscriber fell behind)
/// or `Closed` (the manager stops). `Index` is where to resume: `?index=N` gets every event
/// after the last one sent.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamNotice {
    #[serde(rename = "Index")]
    pub index: u64,
    #[serde(rename = "Time")]
    pub time: DateTime<Utc>,
    #[serde(rename = "Topic")]
    pub topic: &'static str,
    #[serde(rename = "Type")]
    pub kind: &'static str,
    #[serde(rename = "Message")]
    pub message: String,
}

impl StreamNotice {
    pub fn dropped(index: u64) -> StreamNotice {
        StreamNotice {
            index,
            time: Utc::now(),
            topic: "Stream",
            kind: "Dropped",
            message: format!(
                "this subscriber fell more than {CHANNEL} events behind and was dropped; \
                 reconnect with ?index={index} to get every event after the last one sent"
            ),
        }
    }

    pub fn closed(index: u64) -> StreamNotice {
        StreamNotice {
            index,
            time: Utc::now(),
            topic: "Stream",
            kind: "Closed",
            message: format!(
                "the manager is stopping; once it is back, reconnect with ?index={index} (an \
                 index from before its restart answers 410 with the oldest index it has)"
            ),
        }
    }
}

/// Why a subscription cannot start where it was asked to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    /// Events after `since` were dropped from the window (or come from an earlier start of
    /// the manager): `oldest` is the lowest index a subscription can start from.
    #[error(
        "index {since} is older than the events the manager keeps: the oldest index to ask \
         from is {oldest} (?index={oldest}); events between were missed, list again"
    )]
    Expired { since: u64, oldest: u64 },
    #[error("index {since} is ahead of the newest event, {newest}")]
    Ahead { since: u64, newest: u64 },
}

/// The events kept, and the index of the last one.
struct Window {
    /// The index of the last event published (the epoch's first index, before any).
    last: u64,
    events: VecDeque<Arc<Event>>,
    capacity: usize,
}

impl Window {
    /// The lowest index a subscription can start from: every event after it is kept.
    fn oldest_start(&self) -> u64 {
        match self.events.front() {
            Some(oldest) => oldest.index - 1,
            None => self.last,
        }
    }
}

/// What an event's object belongs to: its job and its project (none for a node).
#[derive(Debug, Clone, Default)]
pub(crate) struct Belongs {
    pub(crate) job: Option<String>,
    pub(crate) project: Option<String>,
}

/// Numbers events, keeps the last ones, and hands them to subscribers.
pub struct EventBroker {
    /// A `std` mutex, held to number an event, keep it and send it (a few map operations,
    /// never across an await), or to start a subscription (a copy of the events it resumes
    /// from): the send and the copy under one lock are what make a resumed subscription
    /// miss nothing and repeat nothing.
    window: Mutex<Window>,
    /// Every event goes to every subscriber through it; a send never waits.
    sender: broadcast::Sender<Arc<Event>>,
}

impl EventBroker {
    /// A broker whose first event is `first_index + 1`, keeping `window` events and letting a
    /// subscriber fall `channel` events behind.
    pub fn new(first_index: u64, window: usize, channel: usize) -> EventBroker {
        EventBroker {
            window: Mutex::new(Window {
                last: first_index,
                events: VecDeque::with_capacity(window.min(1024)),
                capacity: window.max(1),
            }),
            sender: broadcast::Sender::new(channel.max(1)),
        }
    }

    /// The broker of a manager started in `epoch`: events from `epoch × 10^12 + 1` on.
    pub fn for_epoch(epoch: u64) -> EventBroker {
        EventBroker::new(epoch.saturating_mul(EPOCH_SPAN), WINDOW, CHANNEL)
    }

    fn window(&self) -> MutexGuard<'_, Window> {
        // Each publish leaves the window whole before anything in it could panic.
        self.window
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The index of the last event (the epoch's start before any): what `X-Cube-Index` says.
    pub fn last_index(&self) -> u64 {
        self.window().last
    }

    /// The lowest index a subscription can start from.
    pub fn oldest_start(&self) -> u64 {
        self.window().oldest_start()
    }

    /// How many subscribers (streams and blocking queries) are attached.
    pub fn subscribers(&self) -> usize {
        self.sender.receiver_count()
    }

    /// Numbers an event, keeps it and sends it to every subscriber; never waits for one.
    /// Returns its index.
    pub(crate) fn publish(
        &self,
        topic: Topic,
        kind: Cow<'static, str>,
        key: String,
        of: Belongs,
        payload: Payload,
        allocation: bool,
    ) -> u64 {
        let Belongs { job, project } = of;
        let mut window = self.window();
        window.last += 1;
        let event = Arc::new(Event {
            index: window.last,
            time: Utc::now(),
            topic,
            kind,
            key,
            job,
            project,
            allocation,
            payload: payload.kept(),
            json: OnceLock::new(),
        });
        if window.events.len() == window.capacity {
            window.events.pop_front();
        }
        window.events.push_back(event.clone());
        // An error only says that nobody listens.
        let _ = self.sender.send(event);
        window.last
    }

    /// A subscription to the events after `since` (the kept ones first, then each as it is
    /// published), or to the events from now on when `since` is `None`.
    pub fn subscribe(&self, since: Option<u64>) -> Result<Subscription, SubscribeError> {
        let window = self.window();
        let live = self.sender.subscribe();
        let Some(since) = since else {
            return Ok(Subscription {
                backlog: VecDeque::new(),
                live,
                position: window.last,
            });
        };
        if since > window.last {
            return Err(SubscribeError::Ahead {
                since,
                newest: window.last,
            });
        }
        let oldest = window.oldest_start();
        if since < oldest {
            return Err(SubscribeError::Expired { since, oldest });
        }
        let after = window.events.partition_point(|event| event.index <= since);
        Ok(Subscription {
            backlog: window.events.range(after..).cloned().collect(),
            live,
            position: since,
        })
    }

    /// Waits until an event after `since` that `relevant` admits is published, `wait` is
    /// over, or `shutdown` is cancelled: the wait of a blocking query. Answers at once when
    /// `since` is not an index the broker can resume from (too old, as 0 is, or from another
    /// start of the manager): the caller cannot know what it missed.
    pub(crate) async fn wait_for(
        &self,
        since: u64,
        wait: Duration,
        shutdown: &tokio_util::sync::CancellationToken,
        relevant: impl Fn(&Event) -> bool,
    ) {
        let Ok(mut subscription) = self.subscribe(Some(since)) else {
            return;
        };
        let changed = async {
            loop {
                match subscription.next().await {
                    Received::Event(event) if !relevant(&event) => continue,
                    // An event that matters, or a wait that fell behind: answer.
                    _ => return,
                }
            }
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => {}
        }
    }
}

/// What a subscription gives next.
#[derive(Debug)]
pub enum Received {
    Event(Arc<Event>),
    /// The subscriber fell behind and was dropped; `position` is the index of the last event
    /// it was given: resuming after it misses nothing.
    Lagged {
        position: u64,
    },
    /// The broker is gone.
    Closed,
}

/// One subscriber's events, in order, each once.
pub struct Subscription {
    /// The kept events it resumed with, not yet given.
    backlog: VecDeque<Arc<Event>>,
    /// The events published since it started.
    live: broadcast::Receiver<Arc<Event>>,
    /// The index of the last event given (or where it started).
    position: u64,
}

impl Subscription {
    /// The index of the last event given, or where the subscription started.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The next event, waiting for one to be published.
    pub async fn next(&mut self) -> Received {
        if let Some(event) = self.backlog.pop_front() {
            self.position = event.index;
            return Received::Event(event);
        }
        loop {
            let received = self.live.recv().await;
            if let Some(received) = self.take(received.map_err(Lag::from)) {
                return received;
            }
        }
    }

    /// The next event if one is there now, without waiting.
    pub fn try_next(&mut self) -> Option<Received> {
        if let Some(event) = self.backlog.pop_front() {
            self.position = event.index;
            return Some(Received::Event(event));
        }
        loop {
            let received = match self.live.try_recv() {
                Err(broadcast::error::TryRecvError::Empty) => return None,
                Ok(event) => Ok(event),
                Err(broadcast::error::TryRecvError::Lagged(_)) => Err(Lag::Lagged),
                Err(broadcast::error::TryRecvError::Closed) => Err(Lag::Closed),
            };
            if let Some(received) = self.take(received) {
                return Some(received);
            }
        }
    }

    /// What a receive gave, as the subscriber sees it; `None` for an event it already had.
    fn take(&mut self, received: Result<Arc<Event>, Lag>) -> Option<Received> {
        match received {
            // The subscription and its backlog were taken under the broker's lock, so the
            // channel starts right after the backlog; this only guards the order.
            Ok(event) if event.index <= self.position => None,
            Ok(event) => {
                self.position = event.index;
                Some(Received::Event(event))
            }
            Err(Lag::Lagged) => Some(Received::Lagged {
                position: self.position,
            }),
            Err(Lag::Closed) => Some(Received::Closed),
        }
    }
}

enum Lag {
    Lagged,
    Closed,
}

impl From<broadcast::error::RecvError> for Lag {
    fn from(err: broadcast::error::RecvError) -> Lag {
        match err {
            broadcast::error::RecvError::Lagged(_) => Lag::Lagged,
            broadcast::error::RecvError::Closed => Lag::Closed,
        }
    }
}

/// Which events a subscriber wants: `?topic=` (any of them; none: all) and `?job=`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub topics: Vec<Topic>,
    /// Events of objects that belong to this job, and the job's own (and its deployments').
    pub job: Option<String>,
}

impl EventFilter {
    pub fn admits(&self, event: &Event) -> bool {
        (self.topics.is_empty() || self.topics.contains(&event.topic))
            && self.job.as_deref().is_none_or(|job| {
                event.job.as_deref() == Some(job)
                    || (matches!(event.topic, Topic::Job | Topic::Deployment) && event.key == job)
            })
    }
}

/// The `Type` of a task's event: the newest history entry the change added, or `Updated`
/// (an entry already in the history before, as when the store's version is put back, is not
/// one the change added).
pub(crate) fn task_event_kind(before: Option<&Task>, after: &Task) -> Cow<'static, str> {
    match after.status.history.last() {
        Some(newest) if before.is_none_or(|before| !before.status.history.contains(newest)) => {
            newest.event.clone()
        }
        _ => Cow::Borrowed("Updated"),
    }
}

/// The `Type`s of a task's events for one change: every history entry the change added, the
/// oldest first (the newest entries that were not in the history before), or `Updated`. A
/// task seen for the first time (`before` is `None`: submitted, or read back at start) is one
/// event, its newest entry: its whole history is not news.
pub(crate) fn task_event_kinds(before: Option<&Task>, after: &Task) -> Vec<Cow<'static, str>> {
    let Some(before) = before else {
        return vec![task_event_kind(None, after)];
    };
    let mut added: Vec<Cow<'static, str>> = after
        .status
        .history
        .iter()
        .rev()
        .take_while(|entry| !before.status.history.contains(entry))
        .map(|entry| entry.event.clone())
        .collect();
    if added.is_empty() {
        return vec![Cow::Borrowed("Updated")];
    }
    added.reverse();
    added
}

/// Publishes a task's change: `before` is the task the cache held (`None`: a new one). A
/// change that added several history entries at once (a worker's first report of a run that
/// is already healthy adds `Running` and `Health`) is an event for each, in order, so that a
/// subscriber waiting for `Running` sees it; the allocation flag goes with the last.
pub(crate) fn publish_task(broker: &EventBroker, before: Option<&Task>, after: &Arc<Task>) {
    let allocation = match before {
        None => holds_resources(after),
        Some(before) => {
            holds_resources(before) != holds_resources(after)
                || (holds_resources(after) && before.status.node_name != after.status.node_name)
        }
    };
    let kinds = task_event_kinds(before, after);
    let last = kinds.len().saturating_sub(1);
    for (index, kind) in kinds.into_iter().enumerate() {
        broker.publish(
            Topic::Task,
            kind,
            after.id.to_string(),
            Belongs {
                job: job_of(after),
                project: Some(after.spec.project.clone()),
            },
            Payload::Task(after.clone()),
            allocation && index == last,
        );
    }
}

fn job_of(task: &Task) -> Option<String> {
    (!task.spec.job.is_empty()).then(|| task.spec.job.clone())
}

/// The `Type` of a job's event, from the record it replaces: `JobStopped` when it stops,
/// `JobScaled` when the job changed under the same version (a count: scaling is not a new
/// version), `JobUpdated` when only the record around it did (the same job and version),
/// `JobRegistered` for a new job or a new version.
pub(crate) fn job_event_kind(before: Option<&JobRecord>, after: &JobRecord) -> &'static str {
    match before {
        Some(before) if after.stopped && !before.stopped => "JobStopped",
        Some(before) if before.version == after.version && before.job != after.job => "JobScaled",
        Some(before) if before.version == after.version && after.promoted && !before.promoted => {
            "JobPromoted"
        }
        Some(before) if before.version == after.version => "JobUpdated",
        Some(_) if after.revert_of.is_some() => "JobReverted",
        _ => "JobRegistered",
    }
}

/// The object of a job's event: its record (`Job`, `Version`, `SubmitTime`, `Stopped`).
pub(crate) fn job_object(record: &JobRecord) -> serde_json::Value {
    serde_json::to_value(record).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::Manager;
    use cube_types::State;

    fn value_event(broker: &EventBroker, topic: Topic, key: &str, job: Option<&str>) -> u64 {
        broker.publish(
            topic,
            Cow::Borrowed("Test"),
            key.to_string(),
            Belongs {
                job: job.map(str::to_string),
                project: None,
            },
            Payload::Value(serde_json::json!({"Name": key})),
            false,
        )
    }

    fn indexes(subscription: &mut Subscription) -> Vec<u64> {
        let mut seen = Vec::new();
        while let Some(Received::Event(event)) = subscription.try_next() {
            seen.push(event.index);
        }
        seen
    }

    #[test]
    fn indexes_start_after_the_epochs_first_and_grow_by_one() {
        let broker = EventBroker::for_epoch(3);
        assert_eq!(broker.last_index(), 3 * EPOCH_SPAN);
        assert_eq!(
            value_event(&broker, Topic::Task, "a", None),
            3 * EPOCH_SPAN + 1
        );
        assert_eq!(
            value_event(&broker, Topic::Node, "b", None),
            3 * EPOCH_SPAN + 2
        );
        assert_eq!(broker.last_index(), 3 * EPOCH_SPAN + 2);
    }

    #[test]
    fn a_subscriber_without_an_index_gets_only_new_events() {
        let broker = EventBroker::new(100, 10, 10);
        value_event(&broker, Topic::Task, "old", None);
        let mut subscription = broker.subscribe(None).unwrap();
        assert_eq!(subscription.position(), 101);
        assert!(subscription.try_next().is_none());
        value_event(&broker, Topic::Task, "new", None);
        assert_eq!(indexes(&mut subscription), vec![102]);
    }

    #[test]
    fn resuming_gets_exactly_the_events_after_the_index_then_live_ones() {
        let broker = EventBroker::new(0, 10, 10);
        for n in 0..5 {
            value_event(&broker, Topic::Task, &n.to_string(), None);
        }
        let mut subscription = broker.subscribe(Some(2)).unwrap();
        value_event(&broker, Topic::Task, "live", None);
        assert_eq!(indexes(&mut subscription), vec![3, 4, 5, 6]);
        let mut at_the_newest = broker.subscribe(Some(6)).unwrap();
        assert!(at_the_newest.try_next().is_none());
    }

    #[test]
    fn an_object_is_kept_as_its_text_and_written_as_it_was_given() {
        let broker = EventBroker::new(0, 10, 10);
        let object = serde_json::json!({"Name": "w1", "Cpu": 2, "Labels": {"zone": "a"}});
        broker.publish(
            Topic::Node,
            Cow::Borrowed("NodeUpdated"),
            "w1".to_string(),
            Belongs::default(),
            Payload::Value(object.clone()),
            false,
        );
        let mut subscription = broker.subscribe(Some(0)).unwrap();
        let Some(Received::Event(event)) = subscription.try_next() else {
            panic!("the event is kept");
        };
        assert!(matches!(event.payload, Payload::Text(_)), "kept as text");
        let line: serde_json::Value = serde_json::from_slice(event.json()).unwrap();
        assert_eq!(line["Object"], object);
        assert_eq!(
            (line["Type"].as_str(), line["Key"].as_str()),
            (Some("NodeUpdated"), Some("w1"))
        );
    }

    #[test]
    fn the_window_is_bounded_and_an_older_index_is_refused_with_the_oldest_start() {
        let broker = EventBroker::new(0, 3, 10);
        for n in 0..5 {
            value_event(&broker, Topic::Task, &n.to_string(), None);
        }
        // Events 3, 4 and 5 are kept: a subscription can start from 2 on.
        assert_eq!(broker.oldest_start(), 2);
        assert_eq!(
            broker.subscribe(Some(1)).err(),
            Some(SubscribeError::Expired {
                since: 1,
                oldest: 2
            })
        );
        let mut subscription = broker.subscribe(Some(2)).unwrap();
        assert_eq!(indexes(&mut subscription), vec![3, 4, 5]);
        assert_eq!(
            broker.subscribe(Some(6)).err(),
            Some(SubscribeError::Ahead {
                since: 6,
                newest: 5
            })
        );
        let message = SubscribeError::Expired {
            since: 1,
            oldest: 2,
        }
        .to_string();
        assert!(message.contains("?index=2"), "{message}");
    }

    #[test]
    fn an_index_from_an_earlier_start_is_too_old() {
        let broker = EventBroker::for_epoch(2);
        assert!(matches!(
            broker.subscribe(Some(EPOCH_SPAN + 5)),
            Err(SubscribeError::Expired { oldest, .. }) if oldest == 2 * EPOCH_SPAN
        ));
        assert!(broker.subscribe(Some(2 * EPOCH_SPAN)).is_ok());
    }

    #[test]
    fn filters_admit_topics_and_a_jobs_events() {
        let broker = EventBroker::new(0, 10, 10);
        let mut subscription = broker.subscribe(None).unwrap();
        value_event(&broker, Topic::Task, "t1", Some("web"));
        value_event(&broker, Topic::Task, "t2", None);
        value_event(&broker, Topic::Job, "web", Some("web"));
        value_event(&broker, Topic::Deployment, "web", None);
        value_event(&broker, Topic::Node, "w1", None);
        value_event(&broker, Topic::Job, "api", Some("api"));
        let mut events = Vec::new();
        while let Some(Received::Event(event)) = subscription.try_next() {
            events.push(event);
        }
        let admitted = |filter: &EventFilter| -> Vec<String> {
            events
                .iter()
                .filter(|event| filter.admits(event))
                .map(|event| format!("{}:{}", event.topic, event.key))
                .collect()
        };
        assert_eq!(admitted(&EventFilter::default()).len(), 6);
        let web = EventFilter {
            topics: Vec::new(),
            job: Some("web".to_string()),
        };
        assert_eq!(admitted(&web), ["Task:t1", "Job:web", "Deployment:web"]);
        let tasks_and_nodes = EventFilter {
            topics: vec![Topic::Task, Topic::Node],
            job: None,
        };
        assert_eq!(
            admitted(&tasks_and_nodes),
            ["Task:t1", "Task:t2", "Node:w1"]
        );
        let web_jobs = EventFilter {
            topics: vec![Topic::Job],
            job: Some("web".to_string()),
        };
        assert_eq!(admitted(&web_jobs), ["Job:web"]);
    }

    #[test]
    fn a_subscriber_that_stops_reading_is_dropped_and_publishing_goes_on() {
        let broker = EventBroker::new(0, 100, 4);
        let mut reader = broker.subscribe(None).unwrap();
        let mut idle = broker.subscribe(None).unwrap();
        for n in 0..3 {
            value_event(&broker, Topic::Task, &n.to_string(), None);
        }
        assert_eq!(indexes(&mut reader), vec![1, 2, 3]);
        // Publishing does not wait for a subscriber: were it to, this loop would never end,
        // as nobody reads `idle`.
        for n in 3..50 {
            value_event(&broker, Topic::Task, &n.to_string(), None);
        }
        assert_eq!(broker.last_index(), 50);
        assert!(matches!(
            idle.try_next(),
            Some(Received::Lagged { position: 0 })
        ));
        assert!(matches!(
            reader.try_next(),
            Some(Received::Lagged { position: 3 })
        ));
        // Where it was dropped is where it resumes: nothing missed, nothing twice.
        let mut resumed = broker.subscribe(Some(3)).unwrap();
        assert_eq!(indexes(&mut resumed), (4..=50).collect::<Vec<_>>());
        let notice = serde_json::to_value(StreamNotice::dropped(3)).unwrap();
        assert_eq!(notice["Topic"], "Stream");
        assert_eq!(notice["Type"], "Dropped");
        assert!(
            notice["Message"].as_str().unwrap().contains("?index=3"),
            "{notice}"
        );
    }

    #[tokio::test]
    async fn a_waiting_subscriber_is_woken_by_a_publish() {
        let broker = Arc::new(EventBroker::new(0, 10, 10));
        let mut subscription = broker.subscribe(None).unwrap();
        let waiting = tokio::spawn(async move {
            match subscription.next().await {
                Received::Event(event) => event.index,
                other => panic!("{other:?}"),
            }
        });
        tokio::task::yield_now().await;
        value_event(&broker, Topic::Node, "w1", None);
        assert_eq!(waiting.await.unwrap(), 1);
    }

    #[test]
    fn a_tasks_event_is_named_after_the_history_entry_the_change_added() {
        let mut task = Task::new("web", "img");
        task.record(Utc::now(), "Submitted", "");
        assert_eq!(task_event_kind(None, &task), "Submitted");
        let mut placed = task.clone();
        placed.status.state = State::Scheduled;
        placed.status.node_name = "w1".into();
        placed.record(Utc::now(), "Placed", "on w1");
        assert_eq!(task_event_kind(Some(&task), &placed), "Placed");
        let mut retried = placed.clone();
        retried.status.pending_reason = Some("x".into());
        assert_eq!(task_event_kind(Some(&placed), &retried), "Updated");
        // The store's older version put back adds nothing.
        assert_eq!(task_event_kind(Some(&placed), &task), "Updated");
        assert_eq!(task_event_kinds(Some(&placed), &task), ["Updated"]);
    }

    #[test]
    fn a_change_that_adds_running_and_health_at_once_is_an_event_for_each_in_order() {
        let mut placed = Task::new("pod", "");
        placed.status.state = State::Scheduled;
        placed.status.node_name = "w1".into();
        placed.record(Utc::now(), "Running", "on w1");
        placed.record(Utc::now(), "Failed", "container a: killed");
        placed.record(Utc::now(), "Restart", "restart 1");
        placed.record(Utc::now(), "Placed", "on w1");
        // A restarted pod's first report: running, and healthy already.
        let mut running = placed.clone();
        running.status.state = State::Running;
        running.record(Utc::now(), "Running", "on w1");
        running.record(Utc::now(), "Health", "healthy");
        assert_eq!(
            task_event_kinds(Some(&placed), &running),
            ["Running", "Health"]
        );
        let broker = EventBroker::new(0, 10, 10);
        let mut subscription = broker.subscribe(None).unwrap();
        publish_task(&broker, Some(&placed), &Arc::new(running));
        let mut kinds = Vec::new();
        while let Some(Received::Event(event)) = subscription.try_next() {
            kinds.push(event.kind.to_string());
        }
        assert_eq!(kinds, ["Running", "Health"]);
        // A task read back at start is one event, not its whole history.
        assert_eq!(task_event_kinds(None, &placed), ["Placed"]);
    }

    #[test]
    fn a_tasks_event_is_written_with_the_task_without_its_history() {
        let broker = EventBroker::new(0, 10, 10);
        let mut subscription = broker.subscribe(None).unwrap();
        let mut task = Task::new("web", "img");
        task.spec.job = "site".into();
        task.status.state = State::Scheduled;
        task.status.node_name = "w1".into();
        task.record(Utc::now(), "Placed", "on w1");
        publish_task(&broker, None, &Arc::new(task.clone()));
        let Some(Received::Event(event)) = subscription.try_next() else {
            panic!("no event");
        };
        assert!(event.allocation, "a placed task holds room on its node");
        let written: serde_json::Value = serde_json::from_slice(event.json()).unwrap();
        assert_eq!(written["Index"], 1);
        assert_eq!(written["Topic"], "Task");
        assert_eq!(written["Type"], "Placed");
        assert_eq!(written["Key"], task.id.to_string());
        assert_eq!(written["Job"], "site");
        assert_eq!(written["Object"]["NodeName"], "w1");
        assert!(written["Object"].get("History").is_none());
        assert!(
            DateTime::parse_from_rfc3339(written["Time"].as_str().unwrap()).is_ok(),
            "{written}"
        );
    }

    #[test]
    fn an_object_that_belongs_to_no_job_has_no_job_field() {
        let broker = EventBroker::new(0, 10, 10);
        let mut subscription = broker.subscribe(None).unwrap();
        value_event(&broker, Topic::Node, "w1", None);
        let Some(Received::Event(event)) = subscription.try_next() else {
            panic!("no event");
        };
        let written: serde_json::Value = serde_json::from_slice(event.json()).unwrap();
        assert!(written.get("Job").is_none(), "{written}");
        assert_eq!(written["Object"]["Name"], "w1");
    }

    #[test]
    fn a_jobs_event_says_whether_it_was_registered_scaled_or_stopped() {
        // Read from JSON, as the store does, so that a field added to the record later
        // does not break this test.
        let first: JobRecord = serde_json::from_value(serde_json::json!({
            "Job": {"Name": "web", "Type": "service",
                    "Groups": [{"Name": "api", "Count": 1, "Task": {"Image": "img"}}]},
            "Version": 1
        }))
        .unwrap();
        assert_eq!(job_event_kind(None, &first), "JobRegistered");
        let mut scaled = first.clone();
        scaled.job.groups[0].count = Some(3);
        assert_eq!(job_event_kind(Some(&first), &scaled), "JobScaled");
        let mut stopped = scaled.clone();
        stopped.stopped = true;
        assert_eq!(job_event_kind(Some(&scaled), &stopped), "JobStopped");
        let mut touched = scaled.clone();
        touched.submit_time = Some(Utc::now());
        assert_eq!(job_event_kind(Some(&scaled), &touched), "JobUpdated");
        let mut next = stopped.clone();
        next.stopped = false;
        next.version = 2;
        assert_eq!(job_event_kind(Some(&stopped), &next), "JobRegistered");
    }

    #[test]
    fn a_manager_started_again_on_its_stores_numbers_its_events_from_a_new_epoch() {
        let stores = crate::cluster::ManagerStores::in_memory();
        let open = || {
            let scheduler = cube_scheduler::scheduler_by_name("roundrobin").unwrap();
            Manager::open(
                crate::manager::test_config(),
                stores.clone(),
                scheduler,
                tokio_util::sync::CancellationToken::new(),
            )
            .unwrap()
        };
        let first = open();
        assert_eq!(first.events().last_index(), EPOCH_SPAN);
        first.cluster.publish(
            Topic::Job,
            "JobRegistered",
            "web",
            Some("web"),
            Some("default"),
            serde_json::json!({}),
        );
        drop(first);
        let second = open();
        assert_eq!(second.events().last_index(), 2 * EPOCH_SPAN);
        assert_eq!(stores.meta.get(crate::cluster::EPOCH_KEY).unwrap(), Some(2));
    }

    #[tokio::test]
    async fn a_node_joining_is_an_event_and_a_heartbeat_of_stats_is_not() {
        let manager = crate::manager::manager_for_tests();
        let mut subscription = manager.events().subscribe(None).unwrap();
        crate::manager::join_test_node(&manager, "w1", 1 << 30).await;
        let Some(Received::Event(joined)) = subscription.try_next() else {
            panic!("no event for a node that joined");
        };
        assert_eq!(
            (joined.topic, &*joined.kind, &*joined.key),
            (Topic::Node, "NodeRegistered", "w1")
        );
        let written: serde_json::Value = serde_json::from_slice(joined.json()).unwrap();
        assert_eq!(written["Object"]["Status"], "Ready");
        crate::manager::join_test_node(&manager, "w1", 1 << 30).await;
        assert!(subscription.try_next().is_none(), "the same report again");
        crate::manager::join_test_node(&manager, "w1", 2 << 30).await;
        let Some(Received::Event(grown)) = subscription.try_next() else {
            panic!("no event for a node that grew");
        };
        assert_eq!(&*grown.kind, "NodeUpdated");
        manager.shutdown.cancel();
    }

    #[tokio::test]
    async fn a_submitted_task_is_an_event_in_the_order_of_its_changes() {
        let manager = crate::manager::manager_for_tests();
        let mut subscription = manager.events().subscribe(None).unwrap();
        let event: cube_types::TaskEvent = serde_json::from_value(serde_json::json!({
            "State": "Running", "Task": {"Name": "web", "Image": "img"}
        }))
        .unwrap();
        let crate::manager::Submitted::Created(task, _) = manager.submit(event).await.unwrap()
        else {
            panic!("not created");
        };
        let Some(Received::Event(submitted)) = subscription.try_next() else {
            panic!("no event for a submitted task");
        };
        assert_eq!(
            (&*submitted.kind, submitted.key.clone()),
            ("Submitted", task.id.to_string())
        );
        assert!(!submitted.allocation, "a Pending task holds nothing");
        manager.request_stop(task.id).await.unwrap();
        let Some(Received::Event(stopped)) = subscription.try_next() else {
            panic!("no event for a stop");
        };
        assert_eq!(&*stopped.kind, "StopRequested");
        assert_eq!(stopped.index, submitted.index + 1);
        manager.shutdown.cancel();
    }
}
