//! `--shard-controllers`: every manager sharing etcd acts for the shards of the ring it
//! holds (issue 32; ARCHITECTURE, "The shard ring").
//!
//! [`act_for_held`] runs this manager's `Manager` for the shards `ring::hold_shards`
//! publishes: its state holds only their projects' tasks, jobs, deployments and waiting
//! list, and its writes are fenced on their `ring/shards/N` keys. When shards are only
//! taken (a dead manager's), they are added to the running `Manager` in place
//! (`Manager::take_shards`: only their records are read in, the rest keeps running); when
//! one is given back (a manager joined), the `Manager` is stopped and opened again for the
//! new set (a shard given back is no longer written: its key is gone, so the fence refuses).
//!
//! [`route`] is the front of such a manager: each request goes where
//! `cube_manager::addressing` says — answered here, by the leader (tokens, projects, the
//! CA), by the owner of the project's shard, by the owner of the task it names, or gathered
//! from every manager (`?project=*`). What every manager must know of the nodes reaches each
//! of them: a worker's report, and a node's drain, eligibility or removal, are handed to
//! every manager on the ring (each follows every worker and marks its own tasks `Lost` when
//! a node goes `Down`), and so are a project's creation, quota and removal (each checks the
//! quotas of its own projects).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use cube_api::tls::PeerIdentity;
use cube_manager::addressing::{self, Addressed, Named, Target};
use cube_store::EtcdDb;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::leading::{Build, FORWARDED, Front};
use crate::ring::Held;

/// Runs a `Manager` for the shards this manager holds, opened again whenever the set
/// changes, until `shutdown`.
pub async fn act_for_held(
    front: Arc<Front>,
    db: EtcdDb,
    build: Build,
    mut held: watch::Receiver<Held>,
    shutdown: CancellationToken,
) {
    let mut running: Option<Acting> = None;
    // After a failed open, the next try's pause (etcd did not answer, or a read of the held
    // shards failed): the same set is opened again, not only at the ring's next change.
    let mut retry = RETRY_FIRST;
    let mut refused = CancellationToken::new();
    loop {
        let now = held.borrow_and_update().clone();
        let started = std::time::Instant::now();
        let mut failed = false;
        let in_place = match &mut running {
            Some(acting) if acting.held.grows_into(&now) && !shutdown.is_cancelled() => {
                take_in_place(&front, &db, acting, &now, &mut refused).await
            }
            _ => false,
        };
        if in_place {
            tracing::info!(
                shards = %format_held(&now),
                took = ?started.elapsed(),
                "acting for the shards held: the ones taken were added in place"
            );
        } else {
            stop_acting(&front, running.take()).await;
            let stopped_in = started.elapsed();
            refused = CancellationToken::new();
            if !now.shards.is_empty() && !shutdown.is_cancelled() {
                match now.fence(&db) {
                    Ok(fence) => {
                        refused = db.set_fence(fence.clone());
                        let term = shutdown.child_token();
                        let scope = now.scope(front.ring);
                        let claims = cube_manager::shard_claims::ClaimsSettings {
                            db: db.clone(),
                            fence,
                        };
                        match crate::leading::open_manager(&build, scope, Some(claims), &term).await
                        {
                            Ok(manager) => {
                                front.set_own(Some(cube_manager::api::router(manager.clone())));
                                front.serving.send_replace(
                                    now.shards.iter().map(|(shard, _)| *shard).collect(),
                                );
                                tracing::info!(
                                    shards = %format_held(&now),
                                    stopped_in = ?stopped_in,
                                    opened_in = ?(started.elapsed() - stopped_in),
                                    "acting for the shards held: their controllers run here"
                                );
                                let loops = tokio::spawn(cube_manager::run_loops(
                                    manager.clone(),
                                    term.clone(),
                                ));
                                running = Some(Acting {
                                    term,
                                    loops,
                                    manager,
                                    held: now,
                                });
                                retry = RETRY_FIRST;
                            }
                            Err(err) => {
                                tracing::error!(
                                    error = %format!("{err:#}"),
                                    retry_in = ?retry,
                                    "cannot load the held shards' state; trying again"
                                );
                                failed = true;
                            }
                        }
                    }
                    Err(err) => tracing::error!(
                        error = %err,
                        "cannot fence the writes of the held shards; acting for none"
                    ),
                }
            } else {
                db.set_fence(None);
            }
        }
        tokio::select! {
            changed = held.changed() => if changed.is_err() { break },
            // A retry's backoff: the held shards' state could not be opened.
            () = tokio::time::sleep(retry), if failed => {
                retry = (retry * 2).min(RETRY_MOST);
            }
            () = refused.cancelled() => {
                tracing::warn!("a write for a held shard was refused: another manager holds it now; waiting for the ring's change");
                if held.changed().await.is_err() { break }
            }
            () = shutdown.cancelled() => break,
        }
    }
    stop_acting(&front, running.take()).await;
}

/// The `Manager` running for the shards `held`.
struct Acting {
    term: CancellationToken,
    loops: tokio::task::JoinHandle<()>,
    manager: Arc<cube_manager::Manager>,
    held: Held,
}

fn format_held(held: &Held) -> String {
    cube_types::shard::format_shards(
        &held
            .shards
            .iter()
            .map(|(shard, _)| *shard)
            .collect::<Vec<_>>(),
    )
}

/// Adds the shards `now` holds beyond what `acting` holds to its running `Manager`
/// (`Manager::take_shards`), its writes fenced on the whole new set from here on; whether
/// it did (if not, the caller opens the state again).
async fn take_in_place(
    front: &Front,
    db: &EtcdDb,
    acting: &mut Acting,
    now: &Held,
    refused: &mut CancellationToken,
) -> bool {
    let fence = match now.fence(db) {
        Ok(fence) => fence,
        Err(err) => {
            tracing::warn!(error = %err, "cannot fence the writes of the shards held; opening their state again");
            return false;
        }
    };
    // The new fence holds every key of the old: what the running controllers write meanwhile
    // passes it as before.
    *refused = db.set_fence(fence.clone());
    let mut scope: Vec<u32> = acting.held.shards.iter().map(|(shard, _)| *shard).collect();
    let mut waiting: Vec<u32> = now
        .shards
        .iter()
        .map(|(shard, _)| *shard)
        .filter(|shard| !scope.contains(shard))
        .collect();
    // Until they are read in, the requests for the shards taken wait (`route`). They are
    // read in one at a time, a shard a request waits for first: on etcd each is a read of
    // its own keys, so the first request is answered after one shard's read, not all of
    // them (a dead manager of 3 held 5 or 6).
    front.taking.send_replace(waiting.clone());
    let mut took = Ok(Ok(true));
    while !waiting.is_empty() {
        let next = next_to_take(&mut waiting, &mut lock(&front.wanted));
        scope.push(next);
        let step = cube_types::shard::ShardScope::of(front.ring, scope.iter().copied());
        let (manager, fence, last) = (acting.manager.clone(), fence.clone(), waiting.is_empty());
        took = tokio::task::spawn_blocking(move || manager.take_shards(step, fence, last)).await;
        if !matches!(took, Ok(Ok(true))) {
            break;
        }
        front.serving.send_replace(scope.clone());
        front.taking.send_replace(waiting.clone());
    }
    front.taking.send_replace(Vec::new());
    lock(&front.wanted).clear();
    match took {
        Ok(Ok(true)) => {
            acting.held = now.clone();
            true
        }
        Ok(Ok(false)) => false,
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "cannot read the records of the shards taken; opening the state of the shards held again");
            false
        }
        Err(err) => {
            tracing::error!(error = %err, "taking shards in place ended abnormally; opening the state again");
            false
        }
    }
}

/// Of the shards still to take (`waiting`, not empty), the one to read in next, taken out
/// of `waiting`: the first a request waits for (`wanted`, which forgets it), or the first.
fn next_to_take(waiting: &mut Vec<u32>, wanted: &mut std::collections::BTreeSet<u32>) -> u32 {
    let next = waiting
        .iter()
        .position(|shard| wanted.contains(shard))
        .unwrap_or(0);
    let shard = waiting.remove(next);
    wanted.remove(&shard);
    shard
}

/// The first pause before opening the held shards' state again after a failure, and the
/// longest.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(100);
const RETRY_MOST: std::time::Duration = std::time::Duration::from_secs(5);

/// Stops the `Manager` that runs (its loops, waited for) and answers nothing with it.
async fn stop_acting(front: &Front, running: Option<Acting>) {
    let Some(Acting { term, loops, .. }) = running else {
        return;
    };
    front.set_own(None);
    front.serving.send_replace(Vec::new());
    term.cancel();
    if let Err(err) = loops.await {
        tracing::error!(error = %err, "the manager's loops ended abnormally");
    }
}

pub(crate) fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Whether a request is a write every manager must apply: what it says of the nodes and
/// of the projects.
fn to_every_manager(method: &Method, route: &str) -> bool {
    matches!(
        (method.as_str(), route),
        ("PUT", "/nodes/{name}")
            | ("DELETE", "/nodes/{name}")
            | ("POST", "/nodes/{name}/drain")
            | ("POST", "/nodes/{name}/eligibility")
            | ("POST", "/projects")
            | ("DELETE", "/projects/{name}")
            | ("PUT", "/projects/{name}/quota")
    )
}

/// The front of a manager acting for its shards: answers `request` here or hands it to
/// the manager that owns what it names (module comment).
pub async fn route(front: &Arc<Front>, peer: Option<PeerIdentity>, request: Request) -> Response {
    // Handed on by another manager: answered here, whoever owns it now (a manager that no
    // longer holds the project's shard answers 421, and the client asks again).
    if request.headers().contains_key(&FORWARDED) {
        if reads_every_project(&request) {
            return here_whole(front, request, false).await;
        }
        return here(front, request).await;
    }
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let query = request.uri().query().map(str::to_string);
    let Some((route, addressed)) = addressing::route_of(method.as_str(), &path) else {
        return here(front, request).await;
    };
    let (parts, body) = request.into_parts();
    let body = match crate::leading::whole_body(body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    if to_every_manager(&method, route) {
        let owners = match owners(front, false).await {
            Ok(owners) => owners,
            Err(refused) => return refused,
        };
        // A project's removal or quota is decided by its owner (who knows its tasks and
        // usage); the rest by the manager asked.
        let decider = match route {
            "/projects/{name}" | "/projects/{name}/quota" => {
                let name = path.split('/').nth(2).unwrap_or("");
                let shard = cube_types::shard::shard_of(name, front.ring);
                match owners.holders.get(&shard) {
                    Some(owner) => owner.clone(),
                    None => return shard_unheld(shard),
                }
            }
            _ => front.me.clone(),
        };
        return to_every(
            front,
            &decider,
            &owners.managers,
            peer.as_ref(),
            parts,
            body,
        )
        .await;
    }
    // The body names the project only when the query does not name one (the manager reads
    // it whole again; a request that names its project is not parsed here).
    let project_param =
        query_param(query.as_deref(), "project").map(|p| if p == "%2A" { "*" } else { p });
    let body_project = if addressed == Addressed::Project
        && method == Method::POST
        && project_param.is_none_or(|project| project == "*")
    {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|value| value.get("Project")?.as_str().map(str::to_string))
    } else {
        None
    };
    let task = addressing::task_named(route, &path, query_param(query.as_deref(), "task"));
    let named = Named {
        project: project_param,
        body_project: body_project.as_deref(),
        task,
    };
    // Where the request goes: a shard's owner, the leader, or here.
    let shard = match addressing::target(addressed, named, front.ring) {
        Target::Here => None,
        Target::Leader => {
            let leader = match front.db.leader().await {
                Ok(Some(leader)) => leader,
                Ok(None) => {
                    return crate::leading::unavailable(
                        "no manager leads at the moment (a new leader is elected within \
                         --leader-ttl): try again"
                            .to_string(),
                    );
                }
                Err(err) => {
                    return crate::leading::unavailable(format!(
                        "cannot read the leader from etcd: {err}"
                    ));
                }
            };
            return ask(front, &leader, peer.as_ref(), &parts, body).await;
        }
        Target::Shard(shard) => Some(shard),
        Target::TaskOwner(id) => match project_of_task(front, &id).await {
            Ok(Some(project)) => Some(cube_types::shard::shard_of(&project, front.ring)),
            // No such task: answered here (the 404 of a task that is not there).
            Ok(None) => None,
            Err(err) => {
                return crate::leading::unavailable(format!(
                    "cannot read task {id} from etcd: {err}"
                ));
            }
        },
        Target::Every => {
            // Read afresh: a read of every project asks every manager that holds a shard. One
            // that cannot be reached (killed, its shards not yet taken by the others) is
            // asked around again after the ring's next change, as a request to one owner is.
            for attempt in 1..=OWNER_ATTEMPTS {
                let owners = match owners(front, true).await {
                    Ok(owners) => owners,
                    Err(refused) => return refused,
                };
                // A shard no one holds (a dead manager's, between its lease's end and its
                // take): every project's list would leave its tasks out without a word.
                if let Some(unheld) =
                    (0..front.ring).find(|shard| !owners.holders.contains_key(shard))
                {
                    if attempt == OWNER_ATTEMPTS {
                        return shard_unheld(unheld);
                    }
                    crate::ring::await_change(&front.db, owners.revision, RING_WAIT).await;
                    continue;
                }
                let mut holding: Vec<String> = owners.holders.values().cloned().collect();
                holding.sort();
                holding.dedup();
                let answer = crate::gather::every_project(
                    front,
                    &holding,
                    peer.as_ref(),
                    parts.clone(),
                    body.clone(),
                )
                .await;
                // A manager that could not be reached, or had not read in the shards it
                // took yet: asked around again once the ring changed (or after a moment).
                let again = answer.extensions().get::<NotReached>().is_some()
                    || answer.headers().contains_key(&crate::leading::NOT_SERVED);
                if attempt == OWNER_ATTEMPTS || !again {
                    return answer;
                }
                crate::ring::await_change(&front.db, owners.revision, RING_WAIT).await;
            }
            return crate::leading::unavailable(
                "the managers holding shards could not all be reached: try again".to_string(),
            );
        }
    };
    let Some(shard) = shard else {
        return here(front, Request::from_parts(parts, Body::from(body))).await;
    };
    // The owner as last read; read again, and the request sent again, once the ring changed,
    // when the owner moved (421: it no longer holds the shard), is opening its state (503),
    // is gone or the shard is held by no one: at least `OWNER_ATTEMPTS` times, and on until
    // `OWNER_PATIENCE` passed. While a dead manager's shards move the ring changes many times
    // within a second (each of its keys goes, each taken shard is written), and those changes
    // alone could spend every attempt before the new owner's take has begun, answering the
    // client the new owner's 421 (seen in the `--acl --tls` sharded test).
    let started = std::time::Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last = attempt >= OWNER_ATTEMPTS && started.elapsed() >= OWNER_PATIENCE;
        let owners = match owners(front, attempt > 1).await {
            Ok(owners) => owners,
            Err(refused) => return refused,
        };
        // Set when this manager holds the shard in etcd but its `Manager` answered that it
        // does not: the shard was taken a moment ago and the take has not begun.
        let mut taking_soon = None;
        let answer = match owners.holders.get(&shard) {
            Some(owner) if *owner == front.me => {
                // Taken a moment ago, and its records being read in: waited for (and read
                // in next, when several are).
                let mut taking = front.taking.subscribe();
                if taking.borrow().contains(&shard) {
                    lock(&front.wanted).insert(shard);
                }
                let _ = tokio::time::timeout(
                    OPENING_BOUND,
                    taking.wait_for(|taking| !taking.contains(&shard)),
                )
                .await;
                taking_soon = Some(taking);
                here(
                    front,
                    Request::from_parts(parts.clone(), Body::from(body.clone())),
                )
                .await
            }
            Some(owner) => {
                match crate::leading::send(front, owner, peer.as_ref(), &parts, body.clone()).await
                {
                    Ok(answer) => crate::leading::streamed(answer),
                    // Never reached it: sent again to the shard's next owner.
                    Err(err) if err.not_sent && !last => {
                        crate::ring::await_change(&front.db, owners.revision, RING_WAIT).await;
                        continue;
                    }
                    Err(err) => crate::leading::unavailable(format!(
                        "the manager {owner} does not answer ({}); its shards are taken by the \
                         others within --leader-ttl: try again",
                        err.message
                    )),
                }
            }
            None => shard_unheld(shard),
        };
        let status = answer.status();
        // A 421 (the shard moved) or a manager's own 503 (it is opening its state) did
        // nothing: sent again. A broken answer is the client's to judge.
        if last
            || !(status == StatusCode::MISDIRECTED_REQUEST
                || (status == StatusCode::SERVICE_UNAVAILABLE
                    && answer.headers().contains_key(&crate::leading::NOT_SERVED)))
        {
            return answer;
        }
        // Held here but not yet taken in: sent again the moment the take begins (or after a
        // bound), which the ring's next change says nothing about; `OWNER_PATIENCE` keeps the
        // attempts going meanwhile.
        if let Some(mut taking) = taking_soon
            && status == StatusCode::MISDIRECTED_REQUEST
        {
            let _ = tokio::time::timeout(RING_WAIT, taking.changed()).await;
            continue;
        }
        // The shard moves (at once when it already has, as after a 421) or its owner opens
        // its state: sent again after the ring's next change, or after a bound.
        crate::ring::await_change(&front.db, owners.revision, RING_WAIT).await;
    }
}

/// How many times a request is sent to its shard's owner while the shard moves, at least.
const OWNER_ATTEMPTS: usize = 6;

/// How long a request is sent again to its shard's owner while the shard moves, at least.
const OWNER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a request waits for the ring's next change before it is sent again.
const RING_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// How long who holds each shard is taken as last read: a request for a shard whose owner
/// has since moved is answered 421 by the old owner and sent again on a fresh read.
const OWNERS_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Who holds each shard: as last read unless `fresh` or older than [`OWNERS_FOR`]; a 503
/// when etcd does not answer.
async fn owners(front: &Front, fresh: bool) -> Result<Arc<crate::ring::Owners>, Response> {
    if !fresh
        && let Some((read, owners)) = &*lock(&front.owners)
        && read.elapsed() < OWNERS_FOR
    {
        return Ok(owners.clone());
    }
    let owners = crate::ring::owners(&front.db).await.map_err(|err| {
        crate::leading::unavailable(format!("cannot read the shard ring from etcd: {err}"))
    })?;
    let owners = Arc::new(owners);
    *lock(&front.owners) = Some((std::time::Instant::now(), owners.clone()));
    Ok(owners)
}

/// A 503 for a shard no manager holds at the moment: nothing was done, so a front may
/// send the request again once the shard is held.
fn shard_unheld(shard: u32) -> Response {
    not_served(format!(
        "shard {shard} is held by no manager at the moment (it is being handed over, within \
         --leader-ttl): try again"
    ))
}

/// Answers with this manager's own `Manager`; while it has none (it is joining the ring,
/// or opening the state of the shards it took), waits up to [`OPENING_BOUND`] for it, then
/// answers 503.
pub(crate) async fn here(front: &Front, request: Request) -> Response {
    let deadline = tokio::time::Instant::now() + OPENING_BOUND;
    loop {
        // Registered before the look, so that a router set in between is not missed.
        let set = front.own_set.notified();
        if let Some(router) = front.own_router() {
            return crate::leading::serve_here(router, request).await;
        }
        if tokio::time::timeout_at(deadline, set).await.is_err() {
            return not_served(format!(
                "{} holds no shard at the moment (it is joining the ring, or opening the state \
                 of the shards it took): try again",
                front.me
            ));
        }
    }
}

/// Whether `request` reads every project (`?project=*`): a part of a gathered read.
fn reads_every_project(request: &Request) -> bool {
    matches!(
        query_param(request.uri().query(), "project"),
        Some("*" | "%2A" | "%2a")
    )
}

/// [`here`], for a part of a read of every project: once this manager's `Manager` has read
/// in every shard the ring says it holds (a dead manager's shards are taken in place, one at
/// a time), waiting up to [`OPENING_BOUND`], else a 503 marked not served, which the
/// gathering front asks again. Answered before, the part left out the taken shards' tasks
/// without a word (tried as a new user would: `cube status --project '*'` showed 4 tasks of 9
/// for a moment after a manager's `kill -9`).
///
/// `ring_just_read`: the gathering front is this manager and read the ring a moment ago (its
/// read is the cache), so it is not read again; a part handed on by another manager reads it.
async fn here_whole(front: &Front, request: Request, ring_just_read: bool) -> Response {
    let owners = match owners(front, !ring_just_read).await {
        Ok(owners) => owners,
        Err(refused) => return refused,
    };
    let mine: Vec<u32> = owners
        .holders
        .iter()
        .filter(|(_, owner)| **owner == front.me)
        .map(|(shard, _)| *shard)
        .collect();
    let mut serving = front.serving.subscribe();
    // The watch's `Ref` is a lock guard: let go of at once, not held across the answer.
    let read_in = matches!(
        tokio::time::timeout(
            OPENING_BOUND,
            serving.wait_for(|serving| mine.iter().all(|shard| serving.contains(shard))),
        )
        .await,
        Ok(Ok(_))
    );
    if !read_in {
        return not_served(format!(
            "{} is still reading in the shards it took: try again",
            front.me
        ));
    }
    here(front, request).await
}

/// How long a request waits for this manager's `Manager` to open.
const OPENING_BOUND: std::time::Duration = std::time::Duration::from_secs(3);

/// A 503 of a manager that did nothing with the request, marked so ([`NOT_SERVED`]) for
/// the front that handed it on, which may send it again.
fn not_served(message: String) -> Response {
    let mut answer = crate::leading::unavailable(message);
    answer.headers_mut().insert(
        &crate::leading::NOT_SERVED,
        axum::http::HeaderValue::from_static("1"),
    );
    answer
}

/// How many tasks' projects a front remembers ([`TaskProjects`]): ~1 MB at most.
const TASK_PROJECTS_KEPT: usize = 16_384;

/// The projects of the tasks a front was lately asked for by ID, the oldest forgotten first
/// beyond [`TASK_PROJECTS_KEPT`]. A task's project never changes and an ID is never given
/// again, so what is remembered stays true; a task removed since is answered 404 by the
/// owner of its project's shard, as it would be from etcd.
#[derive(Default)]
pub(crate) struct TaskProjects {
    by_id: std::collections::HashMap<uuid::Uuid, Arc<str>>,
    order: std::collections::VecDeque<uuid::Uuid>,
}

impl TaskProjects {
    fn get(&self, id: &uuid::Uuid) -> Option<String> {
        self.by_id.get(id).map(|project| project.to_string())
    }

    fn remember(&mut self, id: uuid::Uuid, project: &str) {
        if self.by_id.insert(id, Arc::from(project)).is_some() {
            return;
        }
        self.order.push_back(id);
        while self.order.len() > TASK_PROJECTS_KEPT {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
    }
}

/// The project of the task with ID `id`: as remembered from an earlier request, else from
/// its record in etcd; `None` when there is none.
async fn project_of_task(front: &Front, id: &str) -> Result<Option<String>, String> {
    let Some(stores) = front.sharded.clone() else {
        return Ok(None);
    };
    // Not an ID: no task is under it.
    let Ok(id) = uuid::Uuid::parse_str(id) else {
        return Ok(None);
    };
    if let Some(project) = lock(&front.task_projects).get(&id) {
        return Ok(Some(project));
    }
    // Its project unknown, the task is looked for under every shard at once.
    let project = tokio::task::spawn_blocking(move || stores.stored_task(id, None))
        .await
        .map_err(|err| err.to_string())?
        .map(|task| task.map(|task| task.spec.project.clone()))
        .map_err(|err| err.to_string())?;
    if let Some(project) = &project {
        lock(&front.task_projects).remember(id, project);
    }
    Ok(project)
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How long another manager has to take a cluster-wide write handed to it.
const TELL_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// Hands a write every manager must apply to `decider` first (this manager through its
/// own router), then, once it agreed (a 2xx), to every other, in the background: the
/// decider's answer is the answer. A manager that did not hear (it was restarting, or did
/// not answer within [`TELL_BOUND`]) reads it from etcd when it next opens its state.
async fn to_every(
    front: &Arc<Front>,
    decider: &str,
    managers: &[String],
    peer: Option<&PeerIdentity>,
    parts: axum::http::request::Parts,
    body: axum::body::Bytes,
) -> Response {
    let answer = ask(front, decider, peer, &parts, body.clone()).await;
    if !answer.status().is_success() {
        return answer;
    }
    let others: Vec<String> = managers
        .iter()
        .filter(|manager| manager.as_str() != decider)
        .cloned()
        .collect();
    if others.is_empty() {
        return answer;
    }
    // A project must be known everywhere before its creator's next request (which may go to
    // any manager): its writes wait for the others. A node's report or state does not make a
    // worker wait for every manager.
    let wait = parts.uri.path().starts_with("/projects");
    let (front, peer) = (front.clone(), peer.cloned());
    let telling = tokio::spawn(async move {
        // A few at a time (`Front::telling`): 2,000 nodes registering at once were told each
        // other manager over as many connections at once, ~30 KB each on both ends, and a
        // manager's memory does not come down from such a peak (BENCHMARKS.md).
        let told = futures_util::future::join_all(others.iter().map(|manager| async {
            let _permit = front.telling.acquire().await.ok();
            tokio::time::timeout(
                TELL_BOUND,
                ask(&front, manager, peer.as_ref(), &parts, body.clone()),
            )
            .await
        }))
        .await;
        for (manager, answer) in others.iter().zip(told) {
            let status = answer.map(|answer| answer.status().to_string());
            if !status
                .as_deref()
                .is_ok_and(|status| status.starts_with('2'))
            {
                tracing::debug!(%manager, ?status, route = %parts.uri.path(), "another manager did not take a cluster-wide write");
            }
        }
    });
    if wait && let Err(err) = telling.await {
        tracing::error!(error = %err, "telling the other managers ended abnormally");
    }
    answer
}

/// `parts` and `body` answered by `manager`: this one's own router, or another's over HTTP.
pub(crate) async fn ask(
    front: &Front,
    manager: &str,
    peer: Option<&PeerIdentity>,
    parts: &axum::http::request::Parts,
    body: axum::body::Bytes,
) -> Response {
    if manager == front.me {
        let request = Request::from_parts(parts.clone(), Body::from(body));
        if reads_every_project(&request) {
            return here_whole(front, request, true).await;
        }
        return here(front, request).await;
    }
    match crate::leading::send(front, manager, peer, parts, body).await {
        Ok(answer) => crate::leading::streamed(answer),
        Err(err) => {
            let mut refused = crate::leading::unavailable(format!(
                "the manager {manager} does not answer ({}): try again",
                err.message
            ));
            if err.not_sent {
                refused.extensions_mut().insert(NotReached);
            }
            refused
        }
    }
}

/// Marks the 503 [`ask`] answers when the manager asked was never reached (no connection):
/// nothing was done there, and a read of every project is asked around again once the ring
/// moved (`route`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NotReached;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fronts_memory_of_task_projects_is_bounded_and_forgets_the_oldest_first() {
        let mut kept = TaskProjects::default();
        let ids: Vec<uuid::Uuid> = (0..TASK_PROJECTS_KEPT + 2)
            .map(|_| uuid::Uuid::new_v4())
            .collect();
        for (n, id) in ids.iter().enumerate() {
            kept.remember(*id, &format!("team-{}", n % 7));
        }
        // Remembered again: no second place in the order.
        kept.remember(ids[5], "team-5");
        assert_eq!(kept.by_id.len(), TASK_PROJECTS_KEPT);
        assert_eq!(kept.order.len(), TASK_PROJECTS_KEPT);
        assert_eq!(kept.get(&ids[0]), None);
        assert_eq!(kept.get(&ids[1]), None);
        assert_eq!(kept.get(&ids[2]).as_deref(), Some("team-2"));
        assert_eq!(
            kept.get(&ids[TASK_PROJECTS_KEPT + 1]).as_deref(),
            Some(format!("team-{}", (TASK_PROJECTS_KEPT + 1) % 7).as_str())
        );
    }

    #[test]
    fn a_shard_a_request_waits_for_is_taken_first_then_the_rest_in_order() {
        let mut waiting = vec![2, 5, 9, 11];
        let mut wanted = std::collections::BTreeSet::from([9]);
        assert_eq!(next_to_take(&mut waiting, &mut wanted), 9);
        assert!(wanted.is_empty(), "a shard taken is no longer wanted");
        assert_eq!(next_to_take(&mut waiting, &mut wanted), 2);
        // A shard wanted that is not being taken changes nothing.
        wanted.insert(7);
        assert_eq!(next_to_take(&mut waiting, &mut wanted), 5);
        assert_eq!(next_to_take(&mut waiting, &mut wanted), 11);
        assert!(waiting.is_empty());
    }
}
