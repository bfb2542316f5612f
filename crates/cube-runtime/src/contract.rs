//! The [`Runtime`] contract as one check that every runtime is held to: the Docker runtime
//! against the real engine (this crate's tests), and the simulated runtime the benchmarks
//! measure a manager with (`cube-bench`'s `simulated.rs`), so that the two cannot drift
//! apart unseen. Built for tests only (the `contract` feature, or this crate's own tests).
//!
//! What is checked is what a worker relies on: a created container does not run and has no
//! exit; a second create under a name is a [`RuntimeError::Conflict`]; an image the engine
//! does not have is a [`RuntimeError::Image`]; a started one runs; the list of a node's
//! containers is that node's only, with their labels; a stop ends it with an exit code and
//! a finish time, and is told on the events stream as a death; stopping a stopped or
//! removed container and removing a removed one succeed; a removal (of a running container
//! too) is told as one, and the container is gone from inspect and from the list.
//!
//! Not checked: a PID (a simulated container has no process), health checks, logs, exec
//! and volumes, which the simulated runtime does not offer.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use uuid::Uuid;

use crate::{
    ContainerInfo, ContainerSpec, LABEL_NODE, LABEL_TASK_ID, Runtime, RuntimeError, RuntimeEvent,
};

/// How long an event is waited for: generous, as the check is that it comes.
const EVENT_BOUND: Duration = Duration::from_secs(20);

/// A container of `image` running `cmd`, labelled for `node` and a new task ID.
fn spec(name: &str, image: &str, cmd: &[&str], node: &str) -> (ContainerSpec, Uuid) {
    let task_id = Uuid::new_v4();
    let spec = ContainerSpec {
        name: name.to_string(),
        image: image.to_string(),
        cmd: cmd.iter().map(|part| part.to_string()).collect(),
        labels: HashMap::from([
            (LABEL_TASK_ID.to_string(), task_id.to_string()),
            (LABEL_NODE.to_string(), node.to_string()),
        ]),
        ..ContainerSpec::default()
    };
    (spec, task_id)
}

/// Reads `events` until `wanted` comes, failing after [`EVENT_BOUND`].
async fn await_event(
    events: &mut BoxStream<'static, Result<RuntimeEvent, RuntimeError>>,
    wanted: &RuntimeEvent,
) {
    let seen = tokio::time::timeout(EVENT_BOUND, async {
        while let Some(event) = events.next().await {
            let event = event.expect("the events stream does not fail");
            if &event == wanted {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(seen, Ok(true), "no {wanted:?} on the events stream");
}

async fn inspected<R: Runtime>(runtime: &R, id: &str) -> ContainerInfo {
    runtime
        .inspect(id)
        .await
        .expect("inspect answers")
        .unwrap_or_else(|| panic!("container {id} exists"))
}

async fn listed<R: Runtime>(runtime: &R, node: &str, id: &str) -> Option<ContainerInfo> {
    runtime
        .list_managed(node)
        .await
        .expect("the list answers")
        .into_iter()
        .find(|info| info.id == id)
}

/// Holds `runtime` to the contract, with containers of `image` (which the runtime has, or
/// gets by [`Runtime::ensure_image`]) running `cmd`, a process that runs until it is stopped.
/// `node` names the containers' worker: unique to the call, so that what is listed and told
/// is this check's alone. Panics at the first broken promise.
pub async fn check<R: Runtime>(runtime: &R, image: &str, cmd: &[&str], node: &str) {
    runtime.ensure_image(image).await.expect("the image is had");
    let since = chrono::Utc::now().timestamp() - 1;
    let mut events = runtime.events_since(node, since);

    // Created: there, labelled, not running, no exit yet.
    let name = format!("{node}-contract-a");
    let (first, task_id) = spec(&name, image, cmd, node);
    let id = runtime.create(&first).await.expect("create");
    let created = inspected(runtime, &id).await;
    assert_eq!(created.id, id);
    assert_eq!(created.name, name);
    assert_eq!(created.task_id, Some(task_id));
    assert_eq!(created.node.as_deref(), Some(node));
    assert!(!created.running, "{created:?}");
    assert_eq!(created.exit_code, None, "{created:?}");
    assert_eq!(created.started_at, None, "{created:?}");
    assert_eq!(inspected(runtime, &name).await.id, id, "inspect by name");

    // One container per name; an image the engine lacks is said to be the image's fault.
    match runtime.create(&first).await {
        Err(RuntimeError::Conflict(conflicting)) => assert_eq!(conflicting, name),
        other => panic!("a second create under {name}: {other:?}"),
    }
    let (missing, _) = spec(
        &format!("{node}-contract-missing"),
        "cube-contract-missing:never",
        cmd,
        node,
    );
    match runtime.create(&missing).await {
        Err(RuntimeError::Image { image, .. }) => {
            assert_eq!(image, "cube-contract-missing:never")
        }
        other => panic!("a create of an image not had: {other:?}"),
    }

    // The list is the node's, with what the list can say.
    let on_list = listed(runtime, node, &id)
        .await
        .expect("listed for its node");
    assert_eq!(
        (on_list.name.as_str(), on_list.task_id, on_list.running),
        (name.as_str(), Some(task_id), false)
    );
    assert_eq!(on_list.node.as_deref(), Some(node));
    let elsewhere = format!("{node}-elsewhere");
    assert!(
        listed(runtime, &elsewhere, &id).await.is_none(),
        "another node's list"
    );

    // Started: it runs, since a start time, with no exit.
    runtime.start(&id).await.expect("start");
    let running = inspected(runtime, &id).await;
    assert!(running.running, "{running:?}");
    assert!(running.started_at.is_some(), "{running:?}");
    assert_eq!(running.exit_code, None, "{running:?}");
    assert_eq!(running.finished_at, None, "{running:?}");
    assert!(listed(runtime, node, &id).await.expect("listed").running);

    // Stopped: an exit code and a finish time, told as a death; a second stop succeeds.
    runtime
        .stop(&id, Duration::from_secs(10))
        .await
        .expect("stop");
    let stopped = inspected(runtime, &id).await;
    assert!(!stopped.running, "{stopped:?}");
    assert!(stopped.exit_code.is_some(), "{stopped:?}");
    assert!(
        stopped.finished_at.is_some() && stopped.finished_at >= running.started_at,
        "{stopped:?}"
    );
    assert!(!listed(runtime, node, &id).await.expect("listed").running);
    let task_id = Some(task_id);
    await_event(
        &mut events,
        &RuntimeEvent::Died {
            container_id: id.clone(),
            task_id,
        },
    )
    .await;
    runtime
        .stop(&id, Duration::from_secs(10))
        .await
        .expect("stopping a stopped container");

    // Removed: gone from inspect and the list, told; a second removal and a stop succeed.
    runtime.remove(&id).await.expect("remove");
    assert_eq!(runtime.inspect(&id).await.expect("inspect answers"), None);
    assert!(listed(runtime, node, &id).await.is_none(), "still listed");
    await_event(
        &mut events,
        &RuntimeEvent::Destroyed {
            container_id: id.clone(),
            task_id,
        },
    )
    .await;
    runtime
        .remove(&id)
        .await
        .expect("removing a removed container");
    runtime
        .stop(&id, Duration::from_secs(10))
        .await
        .expect("stopping a removed container");

    // A running container removed: it dies and is gone, and its name is free again.
    let (second, second_task) = spec(&name, image, cmd, node);
    let second_id = runtime
        .create(&second)
        .await
        .expect("the name is free again");
    runtime.start(&second_id).await.expect("start");
    runtime
        .remove(&second_id)
        .await
        .expect("remove a running one");
    assert_eq!(
        runtime.inspect(&second_id).await.expect("inspect answers"),
        None
    );
    await_event(
        &mut events,
        &RuntimeEvent::Died {
            container_id: second_id.clone(),
            task_id: Some(second_task),
        },
    )
    .await;
    await_event(
        &mut events,
        &RuntimeEvent::Destroyed {
            container_id: second_id,
            task_id: Some(second_task),
        },
    )
    .await;
}
