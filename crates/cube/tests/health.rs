//! Health checks as a user meets them: a real `cube worker` (and manager) process and real
//! containers. The probes go to the container's own port from inside its network namespace,
//! so what Docker's userland proxy does on the published host port does not fool them.

mod support;

use serde_json::{Value, json};
use support::*;

fn with(mut task: Value, fields: Value) -> Value {
    for (key, value) in fields.as_object().unwrap() {
        task[key] = value.clone();
    }
    task
}

/// A container that listens on nothing, its port 7777 published all the same: Docker's proxy
/// accepts connections on the host port, nothing answers inside.
fn deaf_task(name: &str) -> Value {
    json!({"Name": name, "Image": SAMPLE_IMAGE, "Cmd": ["/bin/sleep", "3600"],
           "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""},
           "HealthCheckType": "tcp", "HealthCheckInterval": "200ms",
           "HealthCheckRetries": 2})
}

#[tokio::test]
async fn a_tcp_check_of_a_container_that_listens_on_nothing_fails_it_though_its_host_port_accepts()
{
    let worker = WorkerProcess::fresh("deaf");
    let client = worker.client();
    let (id, running) = client.run(&deaf_task("deaf")).await;
    // The premise: the host port accepts a connection, though nothing listens inside.
    let port = host_port(&running, "7777/tcp");
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok(),
        "Docker's proxy should accept on host port {port}"
    );

    let failed = client.await_state(&id, "Failed").await;
    assert_eq!(failed["Health"], "Unhealthy", "{failed}");
    let error = failed["Error"].as_str().unwrap_or_default();
    assert!(
        error.contains("unhealthy") && error.contains("port 7777"),
        "the reason names the check and the container port: {error}"
    );
    let container = running["ContainerID"].as_str().unwrap();
    assert!(
        !container_running(container),
        "an unhealthy container is stopped"
    );
}

#[tokio::test]
async fn checks_probe_the_container_port_so_an_exposed_port_that_is_not_published_is_enough() {
    let worker = WorkerProcess::fresh("exposed");
    let client = worker.client();
    let http = json!({"Name": "http", "Image": SAMPLE_IMAGE, "ExposedPorts": {"7777/tcp": {}},
                      "HealthCheck": "/health", "HealthCheckInterval": "200ms"});
    let tcp = with(
        http.clone(),
        json!({"Name": "tcp", "HealthCheck": "", "HealthCheckType": "tcp"}),
    );
    for task in [http, tcp] {
        let (id, running) = client.run(&task).await;
        assert_eq!(running["HostPorts"], json!({}), "nothing is published");
        let healthy = client
            .await_task(&id, "Health Healthy", |task| task["Health"] == "Healthy")
            .await;
        assert_eq!(healthy["State"], "Running");
    }
}

#[tokio::test]
async fn an_http_check_that_answers_404_inside_the_container_fails_the_task() {
    let worker = WorkerProcess::fresh("h404");
    let client = worker.client();
    let task = with(
        web_task("h404"),
        json!({"HealthCheck": "/healthfail", "HealthCheckInterval": "200ms",
               "HealthCheckRetries": 2}),
    );
    let (id, _) = client.run(&task).await;
    let failed = client.await_state(&id, "Failed").await;
    assert_eq!(failed["Health"], "Unhealthy");
    let error = failed["Error"].as_str().unwrap_or_default();
    assert!(error.contains("GET /healthfail answered 404"), "{error}");
}

#[tokio::test]
async fn a_task_that_ended_shows_no_host_ports_on_the_worker_and_on_the_manager() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("roundrobin", "memory", dir.path(), 0);
    let worker = manager.join_worker(&unique_node("ports"), &[]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();

    // Fails by its own exit code, with its port published while it ran...
    let exits = with(
        shell_task("ports-exit", "sleep 1; exit 3"),
        json!({"ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""}}),
    );
    let exited = client.submit(&exits).await;
    // ... and by its health check (the worker stops the container).
    let unhealthy = client
        .submit(&with(
            web_task("ports-unhealthy"),
            json!({"HealthCheck": "/healthfail", "HealthCheckInterval": "200ms",
                   "HealthCheckRetries": 2}),
        ))
        .await;
    let running = client.await_state(&exited, "Running").await;
    assert!(host_port(&running, "7777/tcp") > 0);
    for id in [&exited, &unhealthy] {
        let failed = client.await_state(id, "Failed").await;
        assert_eq!(failed["HostPorts"], json!({}), "on the manager: {failed}");
        let on_worker = worker.client().get(&format!("/tasks/{id}")).await.body;
        assert_eq!(on_worker["State"], "Failed");
        assert_eq!(
            on_worker["HostPorts"],
            json!({}),
            "on the worker: {on_worker}"
        );
    }
}
