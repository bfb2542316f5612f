//! Deployments as a user meets them: a rolling update that keeps enough copies answering the
//! whole time, an update whose new copies fail their health check and stop the rollout, one
//! that goes back by itself (`AutoRevert`), canaries that wait for `cube job promote`, and a
//! manager killed in the middle of a deployment that finishes it after its restart. Real
//! `cube` processes, the real Docker engine, each copy's own port probed from outside.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// The sample image's web server, as version 1 runs it.
const V1: [&str; 6] = ["httpd", "-f", "-p", "7777", "-h", "/www"];

/// Version 2: the same server, started by another command (it writes a file first).
fn v2() -> Vec<&'static str> {
    vec![
        "sh",
        "-c",
        "echo two > /www/version && exec httpd -f -p 7777 -h /www",
    ]
}

/// A version whose server has no `/health`: its health check fails.
const BROKEN: [&str; 6] = ["httpd", "-f", "-p", "7777", "-h", "/tmp"];

/// A service of `count` copies of the sample server running `cmd`, probed on `/health` every
/// 250 ms, with the group's `Update` block.
fn web(name: &str, count: u32, cmd: &[&str], update: Value) -> Value {
    json!({"Name": name, "Type": "service",
           "Groups": [{"Name": "api", "Count": count, "Update": update,
                       "Task": {"Image": SAMPLE_IMAGE, "Memory": "16MiB", "Cmd": cmd,
                                "ExposedPorts": {"7777/tcp": {}},
                                "PortBindings": {"7777/tcp": ""},
                                "HealthCheck": "/health", "HealthCheckInterval": "250ms",
                                "HealthCheckRetries": 2, "RestartPolicy": "on-failure",
                                "RestartDelay": "1s"}}]})
}

async fn submit(client: &Client, job: &Value) -> Value {
    let answer = client.post_raw("/jobs", job.to_string()).await;
    assert!(
        answer.status == 200 || answer.status == 201,
        "{}",
        answer.body
    );
    answer.body
}

fn deployment_state(job: &Value) -> &str {
    job["Deployment"]["State"].as_str().unwrap_or_default()
}

/// Waits until the deployment of `version` is in `state`.
async fn await_deployment(client: &Client, name: &str, version: u64, state: &str) -> Value {
    client
        .await_job(name, &format!("version {version} {state}"), |job| {
            job["Deployment"]["Version"] == version && deployment_state(job) == state
        })
        .await
}

/// The copies that run `cmd` and are healthy.
fn healthy_running(job: &Value, cmd: &[&str]) -> Vec<Value> {
    live_tasks(job)
        .into_iter()
        .filter(|task| {
            task["State"] == "Running" && task["Health"] == "Healthy" && task["Cmd"] == json!(cmd)
        })
        .collect()
}

/// How many of the job's running copies answer 200 on `/health` at their published port now.
async fn answering(client: &Client, http: &reqwest::Client, name: &str) -> usize {
    let job = client.get(&format!("/jobs/{name}")).await.body;
    let ports: Vec<u16> = job["Tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|task| task["State"] == "Running" && task["HostPorts"]["7777/tcp"].is_array())
        .map(|task| host_port(task, "7777/tcp"))
        .collect();
    let mut count = 0;
    for port in ports {
        let url = format!("http://127.0.0.1:{port}/health");
        // One retry: a busy machine may drop one probe; a stopped copy refuses both.
        for _ in 0..2 {
            if let Ok(answer) = http.get(&url).send().await
                && answer.status().as_u16() == 200
            {
                count += 1;
                break;
            }
        }
    }
    count
}

#[tokio::test]
async fn a_rolling_update_replaces_every_copy_and_never_leaves_fewer_than_count_minus_max_parallel_answering()
 {
    let cluster = OneNodeCluster::start("roll").await;
    let client = Arc::new(cluster.manager.client());
    let update = json!({"MaxParallel": 2, "MinHealthyTime": "1s"});
    let created = submit(&client, &web("roll", 4, &V1, update.clone())).await;
    assert_eq!(created["Outcome"], "new");
    let before = await_deployment(&client, "roll", 1, "successful").await;
    let old: BTreeSet<String> = live_tasks(&before)
        .iter()
        .map(|task| task["ID"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(old.len(), 4);

    // A checker polls every copy's own port every 100 ms through the whole update.
    let done = Arc::new(AtomicBool::new(false));
    let checker = {
        let client = client.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let http = support::http_builder()
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap();
            let mut fewest = usize::MAX;
            let mut samples = 0;
            while !done.load(Ordering::SeqCst) {
                fewest = fewest.min(answering(&client, &http, "roll").await);
                samples += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (fewest, samples)
        })
    };
    // A subscriber follows the deployment's steps on the event stream.
    let mut steps = EventReader::open(&cluster.manager, "?topic=Deployment&job=roll").await;
    let changed = submit(&client, &web("roll", 4, &v2(), update)).await;
    assert_eq!(changed["Outcome"], "changed");
    assert_eq!(changed["Version"], 2);
    let after = await_deployment(&client, "roll", 2, "successful").await;
    done.store(true, Ordering::SeqCst);
    let (fewest, samples) = checker.await.unwrap();
    let mut seen = Vec::new();
    loop {
        let event = steps.next_event().await;
        assert_eq!(event["Topic"], "Deployment", "{event}");
        assert_eq!(event["Object"]["Version"], 2, "{event}");
        let kind = event["Type"].as_str().unwrap().to_string();
        seen.push(kind.clone());
        if kind == "DeploymentSuccessful" {
            break;
        }
    }
    assert_eq!(seen[0], "DeploymentStarted", "{seen:?}");
    assert!(
        seen[1..seen.len() - 1]
            .iter()
            .all(|kind| kind == "DeploymentProgress"),
        "{seen:?}"
    );

    let new = healthy_running(&after, &v2());
    assert_eq!(new.len(), 4, "every copy runs version 2: {after}");
    assert_eq!(live_tasks(&after).len(), 4, "{after}");
    assert!(
        new.iter()
            .all(|task| !old.contains(task["ID"].as_str().unwrap())),
        "every copy was replaced: {after}"
    );
    assert!(
        samples >= 10,
        "the checker sampled the update ({samples} samples)"
    );
    assert!(
        fewest >= 2,
        "at one moment only {fewest} copies answered; never fewer than Count - MaxParallel = 2"
    );
    let versions = client.get("/jobs/roll/versions").await.body;
    assert_eq!(versions[0]["Version"], 2);
    assert_eq!(versions[0]["Stable"], true, "{versions}");
    assert!(
        versions[0]["Diff"][0]
            .as_str()
            .unwrap()
            .contains("Groups[api].Task.Cmd"),
        "{versions}"
    );
}

#[tokio::test]
async fn an_update_whose_copies_fail_their_health_check_stops_at_the_first_and_leaves_the_old_copies_running()
 {
    let cluster = OneNodeCluster::start("broken").await;
    let client = cluster.manager.client();
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "1s", "HealthyDeadline": "30s"});
    submit(&client, &web("broken", 3, &V1, update.clone())).await;
    await_deployment(&client, "broken", 1, "successful").await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.json");
    std::fs::write(&file, web("broken", 3, &BROKEN, update).to_string()).unwrap();
    let (ok, stdout, stderr) = cube_cli(
        &cluster.manager.address(),
        &["job", "run", "--timeout", "60s", file.to_str().unwrap()],
    );
    assert!(!ok, "a failed deployment fails the command: {stdout}");
    assert!(stdout.contains("version 2 (changed)"), "{stdout}");
    assert!(
        stderr.contains("the deployment of job broken version 2 failed")
            && stderr.contains("broken.api[0]"),
        "{stderr}"
    );
    let job = client.get("/jobs/broken").await.body;
    assert_eq!(deployment_state(&job), "failed", "{job}");
    assert_eq!(job["Deployment"]["Groups"]["api"]["Unhealthy"], 1, "{job}");
    // Nothing more was replaced: the two old copies not yet replaced run on, healthy.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let job = client.get("/jobs/broken").await.body;
    assert_eq!(healthy_running(&job, &V1).len(), 2, "{job}");
    let versions = client.get("/jobs/broken/versions").await.body;
    assert_eq!(versions[0]["Stable"], false, "{versions}");
    assert_eq!(versions[1]["Stable"], true, "{versions}");
}

#[tokio::test]
async fn with_auto_revert_a_failed_update_goes_back_to_the_last_stable_version() {
    let cluster = OneNodeCluster::start("revert").await;
    let client = cluster.manager.client();
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "1s", "HealthyDeadline": "30s",
                        "AutoRevert": true});
    submit(&client, &web("revert", 3, &V1, update.clone())).await;
    await_deployment(&client, "revert", 1, "successful").await;

    let changed = submit(&client, &web("revert", 3, &BROKEN, update)).await;
    assert_eq!(changed["Version"], 2);
    // Version 2's deployment fails and the job goes back: version 3 is version 1's spec,
    // rolled out until every copy runs it, healthy.
    let back = await_deployment(&client, "revert", 3, "successful").await;
    assert_eq!(healthy_running(&back, &V1).len(), 3, "{back}");
    assert_eq!(live_tasks(&back).len(), 3, "{back}");
    let versions = client.get("/jobs/revert/versions").await.body;
    assert_eq!(versions[0]["Version"], 3, "{versions}");
    assert_eq!(versions[0]["RevertOf"], 1, "{versions}");
    assert_eq!(versions[0]["Stable"], true, "{versions}");

    let (ok, stdout, stderr) = cube_cli(&cluster.manager.address(), &["job", "history", "revert"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("revert to version 1"), "{stdout}");
    assert!(
        stdout.lines().any(|line| line.starts_with("3 *")),
        "{stdout}"
    );
}

/// What each running copy of `job` serves at `/version` (version 2 writes the file; version
/// 1's server has none, and answers 404), asked of each copy's container on Docker's bridge
/// (`get_in_container`: a 404 through Docker's proxy can arrive as an empty reply).
async fn served_versions(job: &Value) -> Vec<u16> {
    let mut statuses = Vec::new();
    for task in live_tasks(job) {
        let container = task["ContainerID"].as_str().unwrap_or_default().to_string();
        statuses.push(support::get_in_container(&container, 7777, "/version").await);
    }
    statuses
}

#[tokio::test]
async fn cube_job_revert_rolls_the_job_back_to_an_earlier_versions_spec() {
    let cluster = OneNodeCluster::start("manual-revert").await;
    let client = cluster.manager.client();
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "1s"});
    submit(&client, &web("back", 2, &V1, update.clone())).await;
    await_deployment(&client, "back", 1, "successful").await;
    submit(&client, &web("back", 2, &v2(), update)).await;
    let two = await_deployment(&client, "back", 2, "successful").await;
    assert_eq!(healthy_running(&two, &v2()).len(), 2, "{two}");
    assert_eq!(
        served_versions(&two).await,
        [200, 200],
        "version 2 serves /version"
    );

    // The command posts `/jobs/back/revert` and waits for the deployment it starts.
    let address = cluster.manager.address();
    let (ok, stdout, stderr) = cube_cli(
        &address,
        &["job", "revert", "--timeout", "60s", "back", "1"],
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("job back: version 3 (the spec of version 1)"),
        "{stdout}"
    );

    // What a user checks: version 3 runs, every copy is version 1's spec, and what the copies
    // serve is version 1's (no /version file).
    let job = client.get("/jobs/back").await.body;
    assert_eq!(job["Version"], 3, "{job}");
    assert_eq!(job["Deployment"]["Version"], 3, "{job}");
    assert_eq!(deployment_state(&job), "successful", "{job}");
    assert_eq!(healthy_running(&job, &V1).len(), 2, "{job}");
    assert_eq!(
        live_tasks(&job).len(),
        2,
        "only version 1's copies run: {job}"
    );
    assert_eq!(served_versions(&job).await, [404, 404], "{job}");
    for task in live_tasks(&two) {
        let label = format!("cube.task-id={}", task["ID"].as_str().unwrap());
        assert!(
            running_containers_with_label(&label).is_empty(),
            "version 2's copy {} still runs in Docker",
            task["Name"]
        );
    }
    let (ok, stdout, stderr) = cube_cli(&address, &["job", "status", "back"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("api     2        0         0          2         0        0          0"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = cube_cli(&address, &["job", "history", "back"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("revert to version 1"), "{stdout}");
    let versions = client.get("/jobs/back/versions").await.body;
    assert_eq!(versions[0]["Version"], 3, "{versions}");
    assert_eq!(versions[0]["RevertOf"], 1, "{versions}");

    // A version the job never had is refused, and changes nothing.
    let (ok, _, stderr) = cube_cli(&address, &["job", "revert", "back", "9"]);
    assert!(!ok);
    assert!(stderr.contains('9'), "{stderr}");
    assert_eq!(client.get("/jobs/back").await.body["Version"], 3);
}

#[tokio::test]
async fn an_update_whose_new_copies_never_become_healthy_fails_at_its_deadline_and_reverts() {
    let cluster = OneNodeCluster::start("stuck").await;
    let client = cluster.manager.client();
    // Version 1 keeps the default deadlines (minutes): a loaded machine may take seconds to
    // start a copy, and version 1 must succeed. The revert goes back to them too.
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "1s", "AutoRevert": true});
    submit(&client, &web("stuck", 2, &V1, update)).await;
    await_deployment(&client, "stuck", 1, "successful").await;

    // Version 2's server has no `/health`, and its check allows so many failed probes in a
    // row that the copy stays `Starting` (never healthy, never unhealthy, never restarted)
    // for far longer than the test. Its two deadlines are equal (the least ProgressDeadline
    // may be): the deployment fails once they are out, and goes back by itself. The reason
    // names HealthyDeadline: a copy is judged from its creation, never before the
    // deployment's start, so ProgressDeadline (never shorter) is first only for a group that
    // makes no new copy at all (`rollout.rs`'s unit test).
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "1s", "HealthyDeadline": "10s",
                        "ProgressDeadline": "10s", "AutoRevert": true});
    let mut stuck = web("stuck", 2, &BROKEN, update);
    stuck["Groups"][0]["Task"]["HealthCheckRetries"] = json!(100_000);
    let mut steps = EventReader::open(&cluster.manager, "?topic=Deployment&job=stuck").await;
    let changed = submit(&client, &stuck).await;
    assert_eq!(changed["Version"], 2, "{changed}");
    let failed = tokio::time::timeout(STATE_BOUND * 3, async {
        loop {
            // With AutoRevert a failed deployment is stored as reverted at once.
            let event = steps.next_event().await;
            if event["Type"] == "DeploymentFailed" || event["Type"] == "DeploymentReverted" {
                break event;
            }
        }
    })
    .await;
    let Ok(failed) = failed else {
        panic!(
            "version 2's deployment did not fail: {}",
            client.get("/jobs/stuck").await.body
        );
    };
    assert_eq!(failed["Object"]["Version"], 2, "{failed}");
    let reason = failed["Object"]["Reason"].as_str().unwrap_or_default();
    println!("version 2's deployment failed: {reason}");
    assert!(reason.contains("Deadline of 10s"), "{failed}");

    let back = await_deployment(&client, "stuck", 3, "successful").await;
    assert_eq!(healthy_running(&back, &V1).len(), 2, "{back}");
    assert_eq!(
        live_tasks(&back).len(),
        2,
        "version 2's copy was stopped: {back}"
    );
    let versions = client.get("/jobs/stuck/versions").await.body;
    assert_eq!(versions[0]["Version"], 3, "{versions}");
    assert_eq!(versions[0]["RevertOf"], 1, "{versions}");
}

#[tokio::test]
async fn a_canary_starts_beside_the_old_copies_and_the_rest_waits_for_promote() {
    let cluster = OneNodeCluster::start("canary").await;
    let client = cluster.manager.client();
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "0s", "Canary": 1});
    submit(&client, &web("canary", 2, &V1, update.clone())).await;
    await_deployment(&client, "canary", 1, "successful").await;

    submit(&client, &web("canary", 2, &v2(), update)).await;
    let paused = await_deployment(&client, "canary", 2, "paused").await;
    assert_eq!(healthy_running(&paused, &V1).len(), 2, "{paused}");
    assert_eq!(healthy_running(&paused, &v2()).len(), 1, "{paused}");
    // The canary takes the index of the old copy it will replace (the highest).
    assert_eq!(healthy_running(&paused, &v2())[0]["Index"], 1, "{paused}");
    // It stays paused: nothing is replaced without a promotion.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = client.get("/jobs/canary").await.body;
    assert_eq!(deployment_state(&still), "paused", "{still}");
    assert_eq!(healthy_running(&still, &V1).len(), 2, "{still}");

    let (ok, stdout, stderr) = cube_cli(
        &cluster.manager.address(),
        &["job", "promote", "--timeout", "60s", "canary"],
    );
    assert!(ok, "{stdout}\n{stderr}");
    let done = client.get("/jobs/canary").await.body;
    assert_eq!(deployment_state(&done), "successful", "{done}");
    assert_eq!(healthy_running(&done, &v2()).len(), 2, "{done}");
    assert_eq!(live_tasks(&done).len(), 2, "{done}");
    // The group holds indexes 0 and 1, no gap (it was 0 and 2).
    let mut indexes: Vec<u64> = live_tasks(&done)
        .iter()
        .map(|task| task["Index"].as_u64().unwrap())
        .collect();
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1], "{done}");
    // A second promotion has nothing to promote.
    let again = client.post_raw("/jobs/canary/promote", "{}").await;
    assert_eq!(again.status, 400, "{}", again.body);
    assert!(
        again.message().contains("nothing to promote"),
        "{}",
        again.body
    );
}

#[tokio::test]
async fn a_failed_canary_with_auto_revert_goes_back_and_the_group_keeps_indexes_0_to_count() {
    let cluster = OneNodeCluster::start("canrev").await;
    let client = cluster.manager.client();
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "0s", "HealthyDeadline": "30s",
                        "Canary": 1, "AutoRevert": true});
    submit(&client, &web("canrev", 3, &V1, update.clone())).await;
    await_deployment(&client, "canrev", 1, "successful").await;

    // The canary shares the index of an old copy; it fails its health check, and the job
    // goes back to version 1: the canary goes, the old copy of its index stays.
    submit(&client, &web("canrev", 3, &BROKEN, update)).await;
    await_deployment(&client, "canrev", 3, "successful").await;
    let back = client
        .await_job("canrev", "3 copies of version 1 and nothing else", |job| {
            live_tasks(job).len() == 3 && healthy_running(job, &V1).len() == 3
        })
        .await;
    let mut indexes: Vec<u64> = live_tasks(&back)
        .iter()
        .map(|task| task["Index"].as_u64().unwrap())
        .collect();
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1, 2], "{back}");
}

#[tokio::test]
async fn a_manager_killed_in_the_middle_of_a_deployment_finishes_it_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let start = || ManagerProcess::start_with("epvm", "persistent", dir.path(), port, &[]);
    let manager = start();
    let _worker = manager.join_worker(&unique_node("midway"), &[]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let update = json!({"MaxParallel": 1, "MinHealthyTime": "2s"});
    submit(&client, &web("midway", 3, &V1, update.clone())).await;
    await_deployment(&client, "midway", 1, "successful").await;
    submit(&client, &web("midway", 3, &v2(), update)).await;
    let midway = client
        .await_job("midway", "one copy replaced, two to go", |job| {
            job["Deployment"]["Version"] == 2
                && job["Deployment"]["Groups"]["api"]["Healthy"] == 1
                && deployment_state(job) == "running"
        })
        .await;
    let id = midway["Deployment"]["ID"].clone();
    manager.kill_9();

    let manager = start();
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let done = await_deployment(&client, "midway", 2, "successful").await;
    assert_eq!(
        done["Deployment"]["ID"], id,
        "the same deployment carried on"
    );
    assert_eq!(healthy_running(&done, &v2()).len(), 3, "{done}");
    assert_eq!(live_tasks(&done).len(), 3, "no copy twice: {done}");
}

#[tokio::test]
async fn a_scale_or_the_same_spec_again_starts_no_deployment_and_restarts_nothing() {
    let cluster = OneNodeCluster::start("steady").await;
    let client = cluster.manager.client();
    let update = json!({"MinHealthyTime": "0s"});
    submit(&client, &web("steady", 2, &V1, update.clone())).await;
    let first = await_deployment(&client, "steady", 1, "successful").await;
    let ids = |job: &Value| -> BTreeSet<String> {
        live_tasks(job)
            .iter()
            .map(|task| task["ID"].as_str().unwrap().to_string())
            .collect()
    };
    let same = submit(&client, &web("steady", 2, &V1, update.clone())).await;
    assert_eq!(same["Outcome"], "unchanged");
    let scaled = submit(&client, &web("steady", 3, &V1, update)).await;
    assert_eq!(scaled["Outcome"], "scaled");
    assert_eq!(scaled["Version"], 1);
    let three = client
        .await_job("steady", "3 running", |job| {
            healthy_running(job, &V1).len() == 3
        })
        .await;
    assert_eq!(three["Deployment"]["ID"], first["Deployment"]["ID"]);
    assert!(ids(&first).is_subset(&ids(&three)), "nothing was replaced");
    assert_eq!(
        client
            .get("/jobs/steady/versions")
            .await
            .body
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}
