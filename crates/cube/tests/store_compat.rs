//! A store written by an earlier Cube opens unchanged: `fixtures/store-2026-11-27.redb` is the
//! `manager.redb` a manager built from main on 2026-11-27 (before a job's copies shared one
//! spec in memory, and before projects) wrote after a job `web` (group `api`, 3 copies of `httpd` with `Env`,
//! `Memory`, `ExposedPorts` and `HealthCheck`) and a bare task `bare` (`sleep 60`, 8 MiB,
//! `on-failure`) were submitted, with no worker. Today's manager must read every field back.

mod support;

use serde_json::{Value, json};
use support::*;

#[tokio::test]
async fn a_store_written_before_copies_shared_their_spec_opens_with_every_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/store-2026-11-27.redb"
        ),
        dir.path().join("manager.redb"),
    )
    .unwrap();
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), 0);
    let client = manager.client();

    let tasks = client.get("/tasks").await;
    assert_eq!(tasks.status, 200, "{:?}", tasks.body);
    let mut tasks: Vec<Value> = tasks.body.as_array().unwrap().clone();
    tasks.sort_by_key(|task| task["Name"].as_str().unwrap_or_default().to_owned());
    let fields = |task: &Value| {
        json!({
            "Name": task["Name"], "Image": task["Image"], "Cmd": task["Cmd"], "Env": task["Env"],
            "Memory": task["Memory"], "ExposedPorts": task["ExposedPorts"],
            "HealthCheck": task["HealthCheck"], "Job": task["Job"], "Group": task["Group"],
            "Index": task["Index"], "RestartPolicy": task["RestartPolicy"],
            "DesiredState": task["DesiredState"], "State": task["State"],
        })
    };
    let copy = |index: u32| {
        json!({
            "Name": format!("web.api[{index}]"), "Image": "cube-sample:latest",
            "Cmd": ["httpd", "-f", "-p", "8080"], "Env": ["A=b"], "Memory": 16777216,
            "ExposedPorts": {"8080/tcp": {}}, "HealthCheck": "/health", "Job": "web",
            "Group": "api", "Index": index, "RestartPolicy": "no", "DesiredState": "Running",
            "State": "Pending",
        })
    };
    let bare = json!({
        "Name": "bare", "Image": "cube-sample:latest", "Cmd": ["sleep", "60"], "Env": [],
        "Memory": 8388608, "ExposedPorts": {}, "HealthCheck": "", "Job": null, "Group": null,
        "Index": null, "RestartPolicy": "on-failure", "DesiredState": "Running",
        "State": "Pending",
    });
    assert_eq!(
        tasks.iter().map(fields).collect::<Vec<_>>(),
        [bare, copy(0), copy(1), copy(2)]
    );

    // The job reads too, and its copies are still the ones it asks for: a look at it makes
    // no new copy (a spec read differently would have the job replace all three).
    let job = client.get("/jobs/web").await;
    assert_eq!(job.status, 200, "{:?}", job.body);
    let scaled = client
        .request_answer(
            "POST",
            "/jobs/web/scale",
            Some(r#"{"Group": "api", "Count": 4}"#),
        )
        .await;
    assert_eq!(scaled.status, 200, "{:?}", scaled.body);
    let names = async || -> Vec<String> {
        let tasks = client.get("/tasks").await.body;
        let mut names: Vec<String> = tasks
            .as_array()
            .unwrap()
            .iter()
            .map(|task| task["Name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while names().await.len() < 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        names().await,
        [
            "bare",
            "web.api[0]",
            "web.api[1]",
            "web.api[2]",
            "web.api[3]"
        ],
        "the job kept its three copies and added the fourth"
    );

    // Written before projects existed: every record is in `default`, which lists them, and
    // the project's usage and counts are read from them.
    for task in client
        .get("/tasks?project=default")
        .await
        .body
        .as_array()
        .unwrap()
    {
        assert!(
            task.get("Project").is_none(),
            "a default task is written as before: {task}"
        );
    }
    assert_eq!(names().await.len(), 5);
    let star = client.get("/tasks?project=*").await.body;
    assert_eq!(star.as_array().unwrap().len(), 5);
    let jobs = client.get("/jobs?project=default").await.body;
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
    let project = client.get("/projects/default").await;
    assert_eq!(project.status, 200, "{:?}", project.body);
    assert_eq!(project.body["Tasks"], 5, "{:?}", project.body);
    assert_eq!(project.body["Jobs"], 1, "{:?}", project.body);
    let other = client.get("/tasks?project=team-a").await;
    assert_eq!(other.status, 404, "no project was made: {:?}", other.body);
}

/// The store of the release before projects moved into etcd as it was written (`cube store export` reads every record
/// as the JSON the earlier Cube stored; `cube store import` puts those bytes in etcd): a
/// manager on etcd reads it with every record in `default`.
#[tokio::test]
async fn a_store_written_before_projects_opens_on_etcd_with_every_record_in_default() {
    let cluster = cube_test_support::EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let redb = dir.path().join("redb");
    std::fs::create_dir_all(&redb).unwrap();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/store-before-projects.redb"
        ),
        redb.join("manager.redb"),
    )
    .unwrap();
    let exported = dir.path().join("state.jsonl");
    let (status, _, stderr) = cube_command(&[
        "store",
        "export",
        exported.to_str().unwrap(),
        "--data-dir",
        redb.to_str().unwrap(),
    ]);
    assert!(status.success(), "{stderr}");
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
    let etcd = [
        "--etcd-endpoints",
        endpoints.as_str(),
        "--etcd-prefix",
        prefix.as_str(),
    ];
    let mut import = vec![
        "store",
        "import",
        exported.to_str().unwrap(),
        "--store",
        "etcd",
    ];
    import.extend_from_slice(&etcd);
    let (status, _, stderr) = cube_command(&import);
    assert!(status.success(), "{stderr}");

    let manager = ManagerProcess::start_with("epvm", "etcd", dir.path(), 0, &etcd);
    let client = manager.client();
    // A manager on etcd answers 503 until it leads and has read the store.
    let poll = Poll::every(std::time::Duration::from_millis(50), STATE_BOUND);
    let tasks = client
        .await_answer(
            "/tasks?project=default",
            "the manager leading",
            poll,
            |answer| answer.status != 503,
        )
        .await;
    assert_eq!(tasks.status, 200, "{:?}", tasks.body);
    assert_eq!(
        sorted_names(&tasks.body),
        ["bare", "web.api[0]", "web.api[1]", "web.api[2]"]
    );
    let project = client.get("/projects/default").await;
    assert_eq!(project.body["Tasks"], 4, "{:?}", project.body);
    assert_eq!(project.body["Jobs"], 1, "{:?}", project.body);
    let job = client.get("/jobs/web").await;
    assert_eq!(job.status, 200, "{:?}", job.body);
    assert!(job.body["Job"].get("Project").is_none(), "{:?}", job.body);
}

/// `fixtures/store-before-projects.redb` is the `manager.redb` the release before projects
/// (main at 3bc3b88) wrote with `cube manager --acl -d persistent`, after `cube acl
/// bootstrap`, `cube token create --role submit --name ci`, and, with that token, a job `web`
/// (3 copies of `httpd`, 16 MiB, a health check) and a bare task `bare` (`sleep 60`, 8 MiB,
/// `on-failure`), with no worker: both wait in the waiting list. The two tokens' texts are in
/// `store-before-projects.tokens.json` (a test cluster's, nothing else's). Today's manager
/// reads it with everything in `default`, and the old `submit` token holds in `default` only.
#[tokio::test]
async fn a_store_of_the_release_before_projects_keeps_its_tokens_and_waiting_list_in_default() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    std::fs::copy(
        format!("{fixtures}/store-before-projects.redb"),
        dir.path().join("manager.redb"),
    )
    .unwrap();
    let tokens: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{fixtures}/store-before-projects.tokens.json")).unwrap(),
    )
    .unwrap();
    let manager = ManagerProcess::start_with("epvm", "persistent", dir.path(), 0, &["--acl"]);
    let management = Client::with_token(&manager.url, tokens["Management"].as_str().unwrap());
    let submit = Client::with_token(&manager.url, tokens["Submit"].as_str().unwrap());

    let all = ["bare", "web.api[0]", "web.api[1]", "web.api[2]"];
    let tasks = submit.get("/tasks").await;
    assert_eq!(tasks.status, 200, "{:?}", tasks.body);
    assert_eq!(sorted_names(&tasks.body), all);
    assert_eq!(
        sorted_names(&management.get("/tasks?project=*").await.body),
        all
    );
    let queue = submit.get("/queue").await.body;
    let mut entries: Vec<(String, String, String)> = queue
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            assert!(entry.get("Project").is_none(), "{entry}");
            (
                entry["Kind"].as_str().unwrap().to_string(),
                entry["State"].as_str().unwrap().to_string(),
                entry["Owner"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        [
            ("job".to_string(), "waiting".to_string(), "ci".to_string()),
            ("task".to_string(), "waiting".to_string(), "ci".to_string())
        ]
    );
    assert_eq!(submit.get("/jobs/web").await.status, 200);

    // The old token holds in `default` only: a new project is not there for it.
    let made = management
        .request_answer("POST", "/projects", Some(r#"{"Name": "team-a"}"#))
        .await;
    assert_eq!(made.status, 201, "{:?}", made.body);
    assert_eq!(submit.get("/tasks?project=team-a").await.status, 404);
    assert_eq!(management.get("/tasks?project=team-a").await.status, 200);
    let listed = management.get("/acl/tokens").await.body;
    let ci = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|token| token["Name"] == "ci")
        .unwrap()
        .clone();
    assert!(ci.get("Projects").is_none(), "{ci}");
    // And it still submits, in `default`.
    let submitted = submit
        .request_answer(
            "POST",
            "/tasks",
            Some(r#"{"Name": "after", "Image": "cube-sample:latest"}"#),
        )
        .await;
    assert_eq!(submitted.status, 201, "{:?}", submitted.body);
    assert!(
        submitted.body.get("Project").is_none(),
        "{:?}",
        submitted.body
    );
}

/// The tasks' names in a list of tasks, sorted.
fn sorted_names(tasks: &Value) -> Vec<String> {
    let mut names: Vec<String> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["Name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}
