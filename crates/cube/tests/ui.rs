//! The web UI (`/ui`) as a person meets it: the real page in headless Chromium (Debian's
//! `chromium` and `chromium-driver`, through WebDriver) against a real `cube dev` on the
//! real Docker engine. Each test writes screenshots at 1280×800 to the folder it names on
//! its output (`target/ui-screenshots`, or `CUBE_UI_SCREENSHOTS`).

mod support;

use std::path::PathBuf;

use cube_test_support::Browser;
use serde_json::{Value, json};
use support::*;

fn screenshots() -> PathBuf {
    let dir = std::env::var_os("CUBE_UI_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/ui-screenshots")
        });
    std::fs::create_dir_all(&dir).unwrap();
    eprintln!("screenshots: {}", dir.display());
    dir
}

/// Clicks the page's confirmation dialog's "Yes".
async fn confirm(browser: &Browser) {
    browser
        .wait_for("#confirm-text", "a confirmation", |text| !text.is_empty())
        .await;
    browser.press("#confirm-yes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_cluster_live_follows_logs_and_stops_a_task() {
    let dir = tempfile::tempdir().unwrap();
    let node = unique_node("ui");
    let dev = ManagerProcess::start_dev(&node, dir.path());
    let client = dev.client();
    dev.await_ready_nodes(1).await;
    let (web, _) = client.run(&web_task("ui-web")).await;
    let shots = screenshots();

    let browser = Browser::start().await;
    browser.open(&format!("{}/ui", dev.url)).await;
    // The cluster page: the node, and the running task on it.
    browser
        .wait_for("#main", "the node and its running task", |text| {
            text.contains(&node) && text.contains("ui-web")
        })
        .await;
    browser
        .wait_for("#connection", "the live stream", |text| text == "live")
        .await;
    browser.screenshot(&shots.join("cluster.png")).await;

    // A task submitted through the API appears without a reload, and runs.
    browser.press("nav a[data-page=tasks]").await;
    let (logger, _) = client
        .run(&shell_task(
            "ui-logger",
            "i=0; while true; do echo line-$i; i=$((i+1)); sleep 0.2; done",
        ))
        .await;
    browser
        .wait_for(
            &format!("[data-task='{logger}']"),
            "the new task running",
            |text| text.contains("ui-logger") && text.contains("Running"),
        )
        .await;
    browser.screenshot(&shots.join("tasks.png")).await;

    // Its page follows its logs: lines keep coming after the first ones.
    browser.press(&format!("[data-task='{logger}'] a")).await;
    browser.press("#follow-logs").await;
    let first = browser
        .wait_for("#logs", "the task's output", |text| text.contains("line-"))
        .await;
    let last_seen = first
        .lines()
        .filter_map(|line| line.trim().strip_prefix("line-")?.parse::<u64>().ok())
        .max()
        .unwrap();
    browser
        .wait_for("#logs", "lines written after the follow began", |text| {
            text.contains(&format!("line-{}", last_seen + 5))
        })
        .await;
    browser.screenshot(&shots.join("task.png")).await;

    // A command run in it from the page answers there.
    let command = browser.find("#exec-command").await;
    browser
        .type_into(&command, "echo hello-from-the-page")
        .await;
    browser.press("#exec-run").await;
    browser
        .wait_for("#exec-output", "the command's output", |text| {
            text.contains("hello-from-the-page") && text.contains("exit code 0")
        })
        .await;

    // Stopping it from the page stops it: the page asks first, then the manager says so.
    let stop = browser.find("#stop-task").await;
    assert!(browser.is_enabled(&stop).await);
    browser.press("#stop-task").await;
    confirm(&browser).await;
    client
        .await_task(&logger, "stopped from the page", |task| {
            task["DesiredState"] == "Completed" && task["State"] == "Completed"
        })
        .await;
    browser
        .wait_for("#main dl", "the task completed", |text| {
            text.contains("Completed")
        })
        .await;
    assert!(!browser.is_enabled(&browser.find("#stop-task").await).await);

    // A request too big for the node waits in the waiting list, with its position.
    let big = client
        .submit(&json!({"Name": "ui-too-big", "Image": SAMPLE_IMAGE, "Memory": "900TiB"}))
        .await;
    browser.open(&format!("{}/ui#/queue", dev.url)).await;
    browser
        .wait_for(
            &format!("[data-queue='{big}']"),
            "the waiting request",
            |text| text.contains("ui-too-big") && text.contains("waiting") && text.starts_with('1'),
        )
        .await;
    browser.screenshot(&shots.join("queue.png")).await;
    // Its page says why, node by node.
    browser.open(&format!("{}/ui#/tasks/{big}", dev.url)).await;
    browser
        .wait_for("#placement", "why it waits", |text| {
            text.contains(&node) && text.contains("memory")
        })
        .await;
    browser.screenshot(&shots.join("task-waiting.png")).await;

    // A job submitted through the API appears on the jobs page without a reload.
    browser.open(&format!("{}/ui#/jobs", dev.url)).await;
    browser
        .wait_for("#main", "the jobs page", |text| text.contains("Jobs"))
        .await;
    let job = json!({"Name": "ui-job", "Type": "service",
        "Groups": [{"Name": "api", "Count": 2,
                    "Task": {"Image": SAMPLE_IMAGE, "Memory": "16MiB"}}]});
    let answer = client.post_raw("/jobs", job.to_string()).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    browser
        .wait_for(
            "[data-job='ui-job']",
            "the job with its copies running",
            |text| text.contains("ui-job") && text.contains("2 running"),
        )
        .await;
    browser.screenshot(&shots.join("jobs.png")).await;
    browser.open(&format!("{}/ui#/jobs/ui-job", dev.url)).await;
    browser
        .wait_for("#main", "the job's copies and deployment", |text| {
            text.matches("Running").count() >= 2 && text.contains("Deployment")
        })
        .await;
    browser.screenshot(&shots.join("job.png")).await;

    // A rolling update, one copy at a time, each healthy for a second before the next: the
    // job page's deployment shows version 2's healthy copies going up to all of them.
    let rolled = json!({"Name": "ui-job", "Type": "service",
        "Groups": [{"Name": "api", "Count": 3,
                    "Update": {"MaxParallel": 1, "MinHealthyTime": "1s"},
                    "Task": {"Image": SAMPLE_IMAGE, "Memory": "16MiB", "Env": ["VERSION=2"],
                             "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""},
                             "HealthCheck": "/health", "HealthCheckInterval": "250ms"}}]});
    let answer = client.post_raw("/jobs", rolled.to_string()).await;
    assert_eq!(
        answer.status, 200,
        "a new version of the job: {}",
        answer.body
    );
    assert_eq!(answer.body["Outcome"], "changed");
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    browser
        .wait_for("#main", "version 2 rolled out to every copy", |text| {
            if !text.contains("Version 2") {
                return false;
            }
            if let Some(healthy) = text
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(3)
                .find(|words| words[1] == "of" && words[2] == "3")
                .and_then(|words| words[0].parse::<u32>().ok())
            {
                seen.lock().unwrap().insert(healthy);
            }
            text.contains("3 of 3 healthy") && text.contains("successful")
        })
        .await;
    let seen = seen.into_inner().unwrap();
    assert!(
        seen.len() >= 2,
        "the page showed the rollout at one step only: {seen:?} healthy of 3"
    );
    browser.screenshot(&shots.join("job-rolled.png")).await;

    // The events page shows the stream as it comes.
    browser.open(&format!("{}/ui#/events", dev.url)).await;
    browser
        .wait_for("#connection", "the live stream", |text| text == "live")
        .await;
    client.submit(&web_task("ui-after-events")).await;
    browser
        .wait_for("#main table", "the new task's events", |text| {
            text.contains("Task") && text.contains("Submitted")
        })
        .await;
    browser.screenshot(&shots.join("events.png")).await;

    // Projects: the page shows every project the token reaches, or the one picked.
    let made = client
        .post_raw("/projects", json!({"Name": "team-ui"}).to_string())
        .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let theirs = client
        .post_raw(
            "/tasks?project=team-ui",
            web_task("ui-team-task").to_string(),
        )
        .await;
    assert_eq!(theirs.status, 201, "{}", theirs.body);
    let theirs = theirs.body["ID"].as_str().unwrap().to_string();
    browser.open(&format!("{}/ui#/tasks", dev.url)).await;
    browser
        .wait_for(
            "#main",
            "the other project's task among every project's",
            |text| text.contains("ui-team-task") && text.contains("ui-web"),
        )
        .await;
    browser.press("#project option[value='team-ui']").await;
    browser
        .wait_for("#main", "team-ui's task alone", |text| {
            text.contains("ui-team-task") && !text.contains("ui-web")
        })
        .await;
    browser.screenshot(&shots.join("project.png")).await;
    browser.press("#project option[value='*']").await;
    browser
        .wait_for("#main", "every project again", |text| {
            text.contains("ui-web")
        })
        .await;
    client
        .delete(&format!("/tasks/{theirs}?project=team-ui"))
        .await;

    // At a narrow width the page still reads, without a sideways scroll of the whole page.
    browser.set_size(420, 800).await;
    browser.open(&format!("{}/ui", dev.url)).await;
    browser
        .wait_for("#main", "the cluster page", |text| text.contains(&node))
        .await;
    let overflow = browser
        .script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
            vec![],
        )
        .await;
    assert!(
        overflow.as_i64().unwrap_or(0) <= 0,
        "the page is wider than a narrow window by {overflow} px"
    );
    browser.screenshot(&shots.join("cluster-narrow.png")).await;
    drop(browser);

    for id in [&web, &big] {
        client.delete(&format!("/tasks/{id}")).await;
    }
    client.delete("/jobs/ui-job").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_acl_the_page_asks_for_a_token_and_a_read_token_cannot_stop() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_dev_with(&unique_node("ui-acl"), dir.path(), &["--acl"]);
    let anonymous = manager.client();
    let bootstrap = anonymous
        .request_answer("POST", "/acl/bootstrap", Some("{}"))
        .await;
    assert_eq!(bootstrap.status, 201, "{}", bootstrap.body);
    let management = Client::with_token(&manager.url, bootstrap.body["Secret"].as_str().unwrap());
    let made = management
        .request_answer(
            "POST",
            "/acl/tokens",
            Some(&json!({"Role": "read", "Name": "ui-reader"}).to_string()),
        )
        .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let read_secret = made.body["Secret"].as_str().unwrap().to_string();
    let (id, _) = management.run(&web_task("ui-guarded")).await;
    let shots = screenshots();

    let browser = Browser::start().await;
    browser.open(&format!("{}/ui", manager.url)).await;
    // The page asks for a token before it shows anything.
    browser
        .wait_for("#token-dialog", "the token dialog", |text| {
            text.contains("needs a token")
        })
        .await;
    let opened = browser
        .script(
            "return document.getElementById('token-dialog').open;",
            vec![],
        )
        .await;
    assert_eq!(opened, Value::Bool(true));
    browser.screenshot(&shots.join("token.png")).await;
    let input = browser.find("#token-input").await;
    browser.type_into(&input, &read_secret).await;
    browser.press("#token-submit").await;
    browser
        .wait_for("#who", "who the token is", |text| {
            text.contains("ui-reader") && text.contains("read")
        })
        .await;
    // The token is kept in the tab's session storage, never in the address.
    let url = browser.script("return location.href;", vec![]).await;
    assert!(!url.as_str().unwrap().contains(&read_secret));

    browser
        .open(&format!("{}/ui#/tasks/{id}", manager.url))
        .await;
    browser
        .wait_for("#main dl", "the task running", |text| {
            text.contains("ui-guarded") && text.contains("Running")
        })
        .await;
    let stop = browser.find("#stop-task").await;
    assert!(
        !browser.is_enabled(&stop).await,
        "a read token's stop button is disabled"
    );
    browser.screenshot(&shots.join("read-token.png")).await;
    // And the API refuses it anyway.
    let reader = Client::with_token(&manager.url, &read_secret);
    assert_eq!(
        reader
            .request("DELETE", &format!("/tasks/{id}"), None)
            .await,
        403
    );
    let task = management.get(&format!("/tasks/{id}")).await;
    assert_eq!(task.body["DesiredState"], "Running");
    assert_eq!(task.body["State"], "Running");
    management.delete(&format!("/tasks/{id}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_is_shown_and_the_page_comes_back_with_the_manager() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), port);
    let before = manager.client().submit(&web_task("ui-before")).await;
    let browser = Browser::start().await;
    browser.open(&format!("{}/ui#/tasks", manager.url)).await;
    browser
        .wait_for("#main", "the task", |text| text.contains("ui-before"))
        .await;
    browser
        .wait_for("#connection", "the live stream", |text| text == "live")
        .await;

    manager.kill_9();
    browser
        .wait_for("#connection", "the lost connection", |text| {
            text.contains("connection lost")
        })
        .await;
    browser
        .screenshot(&screenshots().join("connection-lost.png"))
        .await;

    // The same manager again, on the same port and store: the page reconnects by itself
    // and shows what changed since.
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), port);
    browser
        .wait_for("#connection", "the stream back", |text| text == "live")
        .await;
    let after = manager.client().submit(&web_task("ui-after")).await;
    browser
        .wait_for(
            &format!("[data-task='{after}']"),
            "the task submitted since",
            |text| text.contains("ui-after"),
        )
        .await;
    assert!(browser.text_of("#main").await.contains("ui-before"));
    for id in [&before, &after] {
        manager.client().delete(&format!("/tasks/{id}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_works_over_tls_with_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with("epvm", "memory", dir.path(), 0, &["--acl", "--tls"]);
    assert!(manager.url.starts_with("https://"), "{}", manager.url);
    // The test's own client trusts the manager's certificate as the browser is told to.
    let insecure = http_builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let bootstrap: Value = insecure
        .post(format!("{}/acl/bootstrap", manager.url))
        .body("{}")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let secret = bootstrap["Secret"].as_str().unwrap().to_string();

    let browser = Browser::start_accepting_any_certificate().await;
    browser.open(&format!("{}/ui", manager.url)).await;
    browser
        .wait_for("#token-dialog", "the token dialog", |text| {
            text.contains("needs a token")
        })
        .await;
    let input = browser.find("#token-input").await;
    browser.type_into(&input, &secret).await;
    browser.press("#token-submit").await;
    browser
        .wait_for("#who", "who the token is", |text| {
            text.contains("management")
        })
        .await;
    browser
        .wait_for("#connection", "the live stream over HTTPS", |text| {
            text == "live"
        })
        .await;
    browser
        .wait_for("#main", "the cluster page", |text| {
            text.contains("No node has joined yet")
        })
        .await;
    browser.screenshot(&screenshots().join("tls.png")).await;
}
