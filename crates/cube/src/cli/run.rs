//! `cube run`: submits a task to the manager, from a task file or from flags as `docker run`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use chrono::Utc;
use clap::{Args, ValueEnum};
use cube_api::ClientError;
use cube_types::duration::parse_duration;
use cube_types::task::{canonical_port, parse_host_side};
use cube_types::{HealthCheckType, RestartPolicy, Submission, Task};
use serde_json::Value;

use super::input::{MAX_TASK_FILE_BYTES, read_task_file};
use super::output::print_json;
use super::queue::{EndpointView, endpoint_addresses};
use super::wait::{Goal, wait_for};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Run a task: an image with flags, as `docker run -d` does, or a task file.
///
/// With IMAGE, the task is built from the flags; the command after `--` replaces the image's.
/// With -f, the file is JSON or YAML (by its extension, else by its first character): a
/// TaskEvent as in the book ({"ID", "State": 2, "Timestamp", "Task": {..}}) or a bare Task
/// ({"Name", "Image", "Cpu", "Memory", "ExposedPorts", "PortBindings", ..}); YAML uses the
/// same field names. `-f -` reads stdin. Cpu is in cores, Memory and Disk in bytes or with a
/// unit ("512MiB"). The task is checked here first, so that a typo is named (with its line
/// in the file) before anything is sent.
///
/// A YAML file with `services` is a compose file, run as one pod: its services share one
/// network (localhost, and each service's name) and are restarted together. Supported:
/// image, command, entrypoint, environment, env_file, ports, expose, volumes, user,
/// working_dir, extra_hosts, depends_on (service_started, service_healthy,
/// service_completed_successfully), healthcheck, labels, restart, network_mode (host, none)
/// and deploy.resources.limits; anything else is refused with its line. Values are
/// interpolated as compose does (${VAR}, ${VAR:-default}, $$ for a $), from the environment,
/// then the .env file beside the compose file.
///
/// Prints the task's full ID on stdout (with -o json: the task as the manager stored it), and
/// on stderr its state and how to follow it. Submitting a file again with the same task ID
/// does not start a second task; a changed file with the same ID is refused.
#[derive(Debug, Args)]
#[command(
    override_usage = "cube run [OPTIONS] IMAGE [-- CMD [ARG]...]\n       cube run [OPTIONS] -f FILE",
    after_help = "Examples:\n  \
    cube run cube-sample:latest                       # like docker run -d\n  \
    cube run --name web -p 8080:7777 --memory 64MiB --cpus 500m cube-sample:latest\n  \
    cube run --wait --restart on-failure busybox:latest -- sh -c 'sleep 60'\n  \
    cube run -f examples/sample-task.yaml\n  \
    cube run -f web.json -m 10.0.0.5:5555\n  \
    cat web.yaml | cube run -f -\n  \
    ID=$(cube run -f web.json) && cube status \"$ID\"\n  \
    cube run -f web.json -o json | jq .State"
)]
pub struct RunArgs {
    /// The task file: a TaskEvent or a Task, as JSON or YAML; `-` reads stdin.
    #[arg(short, long, value_name = "FILE", conflicts_with = "task_flags")]
    file: Option<PathBuf>,
    #[command(flatten)]
    task: TaskFlags,
    /// Wait until the task runs and has stayed up for a second; fail with the task's error if
    /// it fails first.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits (e.g. 30s, 2m).
    #[arg(long, default_value = "2m", value_parser = parse_duration, requires = "wait")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// The task as flags, for `cube run IMAGE`.
#[derive(Debug, Args)]
#[group(id = "task_flags", multiple = true)]
struct TaskFlags {
    /// The image to run (instead of -f).
    #[arg(value_name = "IMAGE")]
    image: Option<String>,
    /// The command and its arguments, after `--`, replacing the image's command.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
    /// The task's name [default: task-<short ID>].
    #[arg(long)]
    name: Option<String>,
    /// Publish a port: HOST:CONTAINER, or CONTAINER alone to let Docker pick the host port;
    /// IP:HOST:CONTAINER publishes on that address of the node only (127.0.0.1:8080:7777 keeps
    /// it to loopback; IP::CONTAINER lets Docker pick the port there; an IPv6 address goes in
    /// brackets, [::1]:8080:7777). CONTAINER may end in /tcp, /udp or /sctp. Repeatable.
    #[arg(short, long = "publish", value_name = "[[IP:]HOST:]CONTAINER[/PROTO]")]
    publish: Vec<String>,
    /// Set an environment variable, KEY=value, or KEY to pass this shell's value. Repeatable.
    #[arg(short, long, value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Use the project's secret NAME, read-only at /run/secrets/NAME (on tmpfs); NAME:VAR
    /// puts it in the variable VAR instead (`docker inspect` on the node shows variables).
    /// Repeatable. Make one with `cube secret create`.
    #[arg(long = "secret", value_name = "NAME[:VAR]")]
    secrets: Vec<String>,
    /// Mount a named volume, NAME:/path[:ro], kept on the node when the task ends (`cube
    /// volume ls`), or a directory of the node, /host/path:/path[:ro] (under the worker's
    /// allowed_host_paths). Repeatable.
    #[arg(short = 'v', long = "volume", value_name = "NAME:/PATH[:ro]")]
    volumes: Vec<String>,
    /// CPU cores: a number (0.5) or millicores (500m).
    #[arg(long, value_parser = cube_types::cpu::parse_cpu)]
    cpus: Option<f64>,
    /// Memory limit: bytes or a size (256MiB, 256Mi, 256m as Docker reads it).
    #[arg(long, value_parser = cube_types::size::parse_size)]
    memory: Option<u64>,
    /// Disk the task needs, for placement: bytes or a size (1GiB).
    #[arg(long, value_parser = cube_types::size::parse_size)]
    disk: Option<u64>,
    /// When Cube restarts the task after it ends.
    #[arg(long, value_enum)]
    restart: Option<RestartFlag>,
    /// How many restarts at most [default: no limit].
    #[arg(long, value_name = "N")]
    max_restarts: Option<u32>,
    /// An HTTP path probed on the first published port (e.g. /health); 200 is healthy.
    #[arg(long, value_name = "PATH")]
    health_check: Option<String>,
    /// How the health check probes: http (the path) or tcp (a connection).
    #[arg(long, value_enum, value_name = "TYPE")]
    health_check_type: Option<HealthCheckFlag>,
    /// Who asks for the task, in the waiting list (default: anonymous; with a manager
    /// running --acl, the token's name, and only an operator or management token may give
    /// another).
    #[arg(long, value_name = "NAME")]
    owner: Option<String>,
    /// Its place in the waiting list: 0 (least) to 100 (most) [default: 50].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=100))]
    priority: Option<u8>,
    /// How long it may wait in the queue for room before it gives up (expired), e.g. 5m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    queue_timeout: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RestartFlag {
    No,
    OnFailure,
    Always,
    UnlessStopped,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum HealthCheckFlag {
    Http,
    Tcp,
}

pub async fn run_task(args: RunArgs) -> anyhow::Result<()> {
    // The submission is parsed (and so validated) here, as the manager will; what is sent is
    // the document as written.
    let (origin, document, _submission) = match &args.file {
        Some(path) => {
            let file = read_task_file(path)?;
            (file.origin, file.document, file.submission)
        }
        None => task_from_flags(&args.task)?,
    };
    let manager = ManagerClient::connect(&args.flags)?;
    let (status, mut answer): (u16, serde_json::Value) = manager
        .post("/tasks", &document)
        .await
        .map_err(|err| explain_refusal(err, &origin))?;
    // The answer is the task, with `Warnings` beside its fields when no node could hold it
    // today (it is accepted and waits all the same).
    let warnings: Vec<String> = answer
        .as_object_mut()
        .and_then(|fields| fields.remove("Warnings"))
        .and_then(|warnings| serde_json::from_value(warnings).ok())
        .unwrap_or_default();
    let task: Task = serde_json::from_value(answer)
        .map_err(|err| anyhow!("cannot read the manager's answer: {err}"))?;
    for warning in &warnings {
        eprintln!("warning: task {}: {warning}", task.name);
    }

    match args.flags.output {
        OutputFormat::Json if !args.wait => print_json(&task)?,
        OutputFormat::Json => {}
        OutputFormat::Table => {
            println!("{}", task.id);
            let short = task.short_id();
            if status == 200 {
                eprintln!(
                    "task {} ({short}) already exists, unchanged: {}; see it with: cube status \
                     {short}{}",
                    task.name,
                    task.status.state,
                    args.flags.manager_hint()
                );
            } else {
                eprintln!(
                    "task {} ({short}) accepted: {}; see it with: cube status {short}{}",
                    task.name,
                    task.status.state,
                    args.flags.manager_hint()
                );
            }
            if let Some(reason) = &task.status.pending_reason
                && !args.wait
            {
                eprintln!("waiting: {reason}");
            }
        }
    }
    if args.wait {
        let (running, entry) = wait_for(&manager, task.id, Goal::Running, args.timeout).await?;
        match args.flags.output {
            OutputFormat::Json => print_json(&running)?,
            OutputFormat::Table => {
                eprintln!(
                    "task {} ({}) is {}{}",
                    running.name,
                    running.short_id(),
                    running.status.state,
                    if running.status.node_name.is_empty() {
                        String::new()
                    } else {
                        format!(" on {}", running.status.node_name)
                    }
                );
                // Claimed: where it answers, one line per copy (on stderr with the other
                // words for people: stdout holds the ID alone, for `ID=$(cube run ...)`).
                if let Some(entry) = entry {
                    for endpoint in &entry.services {
                        eprintln!("{}: {}", endpoint.name, published_at(endpoint, &running));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Where a running task answers, as `cube service` shows it (`127.0.0.1:49153->7777/tcp`:
/// the node's address and the host port), and what Docker bound, so that a port published
/// on every address is not mistaken for one kept to the node's loopback:
/// `127.0.0.1:49153->7777/tcp (Docker bound 0.0.0.0:49153: every address of node w1)`, or
/// `127.0.0.1:8080->7777/tcp (Docker bound 127.0.0.1:8080: that address only)`.
fn published_at(endpoint: &EndpointView, task: &Task) -> String {
    if endpoint.ports.is_empty() {
        return endpoint_addresses(endpoint);
    }
    endpoint
        .ports
        .iter()
        .map(|(port, address)| {
            let bindings = task
                .status
                .run
                .host_ports
                .get(port)
                .map(Vec::as_slice)
                .unwrap_or_default();
            if bindings.is_empty() {
                return format!("{address}->{port}");
            }
            let bound: Vec<String> = bindings
                .iter()
                .map(|binding| match binding.host_ip.as_str() {
                    "" => format!("0.0.0.0:{}", binding.host_port),
                    ip if ip.contains(':') => format!("[{ip}]:{}", binding.host_port),
                    ip => format!("{ip}:{}", binding.host_port),
                })
                .collect();
            let everywhere = bindings
                .iter()
                .any(|binding| matches!(binding.host_ip.as_str(), "" | "0.0.0.0" | "::"));
            let reach = if everywhere {
                format!("every address of node {}", endpoint.node)
            } else {
                "that address only".to_string()
            };
            format!(
                "{address}->{port} (Docker bound {}: {reach})",
                bound.join(" and ")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The manager's refusal in the words of the command line: a 409 means the task ID is taken
/// by a task with another spec, which `cube run` cannot change (the manager's message names
/// the fields and what to do); it is said with the file it came from.
fn explain_refusal(err: anyhow::Error, origin: &str) -> anyhow::Error {
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::Status {
            status, message, ..
        }) if status.as_u16() == 409 => anyhow!("{origin}: {message}"),
        _ => err,
    }
}

/// The task that `cube run IMAGE` flags describe, checked as a file would be, and the JSON
/// document to send.
fn task_from_flags(flags: &TaskFlags) -> anyhow::Result<(String, Value, Submission)> {
    let Some(image) = &flags.image else {
        bail!("give an IMAGE to run, or a task file with -f FILE");
    };
    let mut task = Task::new(flags.name.clone().unwrap_or_default(), image.clone());
    task.spec.cmd = flags.command.clone();
    task.spec.cpu = flags.cpus.unwrap_or(0.0);
    task.spec.memory = flags.memory.unwrap_or(0);
    task.spec.disk = flags.disk.unwrap_or(0);
    for entry in &flags.env {
        task.spec.env.push(env_entry(entry)?);
    }
    for secret in &flags.secrets {
        let (name, env) = match secret.split_once(':') {
            Some((name, var)) => (name, Some(var.to_string())),
            None => (secret.as_str(), None),
        };
        task.spec.secrets.push(cube_types::secret::SecretUse {
            name: name.to_string(),
            env,
        });
    }
    for volume in &flags.volumes {
        task.spec.volumes.push(
            volume
                .parse()
                .map_err(|why| anyhow::anyhow!("-v {volume}: {why}"))?,
        );
    }
    for publish in &flags.publish {
        let (container, host) = parse_publish(publish)?;
        task.spec.exposed_ports.insert(container.clone());
        task.spec.port_bindings.insert(container, host);
    }
    if let Some(restart) = flags.restart {
        task.spec.restart_policy = match restart {
            RestartFlag::No => RestartPolicy::No,
            RestartFlag::OnFailure => RestartPolicy::OnFailure,
            RestartFlag::Always => RestartPolicy::Always,
            RestartFlag::UnlessStopped => RestartPolicy::UnlessStopped,
        };
    }
    task.spec.max_restarts = flags.max_restarts;
    if let Some(path) = &flags.health_check {
        task.spec.health_check = path.clone();
    }
    task.spec.health_check_type = flags.health_check_type.map(|kind| match kind {
        HealthCheckFlag::Http => HealthCheckType::Http,
        HealthCheckFlag::Tcp => HealthCheckType::Tcp,
    });
    task.spec.owner = flags.owner.clone().unwrap_or_default();
    task.spec.priority = flags.priority;
    task.spec.queue_timeout = flags.queue_timeout;
    let findings = task.validate();
    if !findings.is_empty() {
        bail!("invalid task: {}", findings.join("; "));
    }
    // Sent as the manager's own encoding of the task; the manager ignores the observed
    // fields in it. The same check the manager runs (as for a file) comes first.
    let document = serde_json::to_value(&task).context("cannot encode the task as JSON")?;
    let encoded = serde_json::to_vec(&document).context("cannot encode the task as JSON")?;
    if encoded.len() > MAX_TASK_FILE_BYTES {
        bail!(
            "the task is {} bytes, larger than the manager's limit of {MAX_TASK_FILE_BYTES} bytes",
            encoded.len()
        );
    }
    let submission =
        Submission::parse(&encoded, Utc::now()).map_err(|err| anyhow!("invalid task: {err}"))?;
    Ok((format!("image {image}"), document, submission))
}

/// `KEY=value` as given; `KEY` alone takes this shell's value, as `docker run -e KEY` does.
fn env_entry(entry: &str) -> anyhow::Result<String> {
    if entry.contains('=') {
        return Ok(entry.to_string());
    }
    match std::env::var(entry) {
        Ok(value) => Ok(format!("{entry}={value}")),
        Err(_) => bail!("-e {entry}: no '=' and no variable {entry} in the environment to pass"),
    }
}

/// `-p [[IP:]HOST:]CONTAINER[/PROTO]`, as `docker run -p` takes it → (`"80/tcp"`, the host
/// side as a task file's `PortBindings` writes it: `"8080"`, `"127.0.0.1:8080"`,
/// `"127.0.0.1:"`, or `""` to let Docker choose).
fn parse_publish(text: &str) -> anyhow::Result<(String, String)> {
    let (host, container) = text.rsplit_once(':').unwrap_or(("", text));
    let container = canonical_port(container).map_err(|why| anyhow!("-p {text}: {why}"))?;
    let host = host.trim();
    parse_host_side(host).map_err(|why| {
        anyhow!(
            "-p {text}: {why}; -p takes CONTAINER, HOST:CONTAINER or IP:HOST:CONTAINER \
             (e.g. 80, 8080:80, 127.0.0.1:8080:80, 53:53/udp)"
        )
    })?;
    Ok((container, host.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_port_takes_docker_forms() {
        assert_eq!(
            parse_publish("8080:80").unwrap(),
            ("80/tcp".to_string(), "8080".to_string())
        );
        assert_eq!(
            parse_publish("7777").unwrap(),
            ("7777/tcp".to_string(), String::new())
        );
        assert_eq!(
            parse_publish("53:53/udp").unwrap(),
            ("53/udp".to_string(), "53".to_string())
        );
        assert!(parse_publish("99999:80").is_err());
        assert!(parse_publish("http").is_err());
    }

    #[test]
    fn a_published_port_may_name_the_host_address() {
        assert_eq!(
            parse_publish("127.0.0.1:8080:7777").unwrap(),
            ("7777/tcp".to_string(), "127.0.0.1:8080".to_string())
        );
        assert_eq!(
            parse_publish("127.0.0.1::7777").unwrap(),
            ("7777/tcp".to_string(), "127.0.0.1:".to_string())
        );
        assert_eq!(
            parse_publish("[::1]:8080:53/udp").unwrap(),
            ("53/udp".to_string(), "[::1]:8080".to_string())
        );
        let err = parse_publish("localhost:8080:7777")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("-p localhost:8080:7777: \"localhost\" is not an IP address")
                && err.contains("IP:HOST:CONTAINER"),
            "{err}"
        );
        let err = parse_publish("1:2:3:4").unwrap_err().to_string();
        assert!(err.contains("-p takes CONTAINER, HOST:CONTAINER"), "{err}");
    }

    #[test]
    fn a_published_port_says_what_docker_bound_beside_where_it_answers() {
        let endpoint = |ports: &[(&str, &str)]| EndpointView {
            id: None,
            name: "web".to_string(),
            node: "w1".to_string(),
            address: "127.0.0.1".to_string(),
            ports: ports
                .iter()
                .map(|(port, address)| (port.to_string(), address.to_string()))
                .collect(),
        };
        let bound = |pairs: &[(&str, &str)]| -> Vec<cube_types::HostBinding> {
            pairs
                .iter()
                .map(|(ip, port)| cube_types::HostBinding {
                    host_ip: ip.to_string(),
                    host_port: port.to_string(),
                })
                .collect()
        };
        let mut task = Task::new("web", "cube-sample:latest");
        task.status.run.host_ports.insert(
            "7777/tcp".into(),
            bound(&[("0.0.0.0", "49153"), ("::", "49153")]),
        );
        task.status
            .run
            .host_ports
            .insert("8080/tcp".into(), bound(&[("127.0.0.1", "8080")]));
        assert_eq!(
            published_at(
                &endpoint(&[
                    ("7777/tcp", "127.0.0.1:49153"),
                    ("8080/tcp", "127.0.0.1:8080")
                ]),
                &task
            ),
            "127.0.0.1:49153->7777/tcp (Docker bound 0.0.0.0:49153 and [::]:49153: every \
             address of node w1), 127.0.0.1:8080->8080/tcp (Docker bound 127.0.0.1:8080: that \
             address only)"
        );
        assert_eq!(published_at(&endpoint(&[]), &task), "-");
    }

    #[test]
    fn cpus_are_cores_or_millicores() {
        assert_eq!(cube_types::cpu::parse_cpu("0.5"), Ok(0.5));
        assert_eq!(cube_types::cpu::parse_cpu("500m"), Ok(0.5));
        assert_eq!(cube_types::cpu::parse_cpu("2"), Ok(2.0));
        assert!(cube_types::cpu::parse_cpu("lots").is_err());
    }

    #[test]
    fn memory_takes_cube_kubernetes_and_docker_units() {
        let mib = 1024 * 1024;
        assert_eq!(cube_types::size::parse_size("256MiB"), Ok(256 * mib));
        assert_eq!(cube_types::size::parse_size("256Mi"), Ok(256 * mib));
        assert_eq!(cube_types::size::parse_size("256m"), Ok(256 * mib));
        assert_eq!(cube_types::size::parse_size("1g"), Ok(1024 * mib));
        assert_eq!(cube_types::size::parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(cube_types::size::parse_size("1024"), Ok(1024));
        assert!(cube_types::size::parse_size("lots").is_err());
    }

    #[test]
    fn flags_build_the_task_a_file_would_describe() {
        let flags = TaskFlags {
            image: Some("cube-sample:latest".to_string()),
            command: vec!["sh".to_string(), "-c".to_string(), "exit 3".to_string()],
            name: Some("web".to_string()),
            publish: vec!["7777".to_string()],
            env: vec!["A=1".to_string()],
            secrets: Vec::new(),
            volumes: Vec::new(),
            cpus: Some(0.5),
            memory: Some(64 * 1024 * 1024),
            disk: None,
            restart: Some(RestartFlag::OnFailure),
            max_restarts: Some(2),
            health_check: Some("/health".to_string()),
            health_check_type: None,
            owner: None,
            priority: None,
            queue_timeout: None,
        };
        let (_, _, submission) = task_from_flags(&flags).unwrap();
        let task = submission.event.task;
        assert_eq!(task.name, "web");
        assert_eq!(task.spec.port_bindings["7777/tcp"], "");
        assert!(task.spec.exposed_ports.contains("7777/tcp"));
        assert_eq!(task.spec.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(task.spec.cmd, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn a_health_check_without_a_port_is_refused_before_sending() {
        let flags = TaskFlags {
            image: Some("cube-sample:latest".to_string()),
            command: Vec::new(),
            name: None,
            publish: Vec::new(),
            env: Vec::new(),
            secrets: Vec::new(),
            volumes: Vec::new(),
            cpus: None,
            memory: None,
            disk: None,
            restart: None,
            max_restarts: None,
            health_check: Some("/health".to_string()),
            health_check_type: None,
            owner: None,
            priority: None,
            queue_timeout: None,
        };
        let err = task_from_flags(&flags).unwrap_err().to_string();
        assert!(err.contains("HealthCheck"), "{err}");
    }
}
