//! A damaged store is never served as if it were fine: real `cube` processes on real redb
//! files that the tests empty, cut and overwrite, and `cube store backup`/`restore` between
//! them. A manager with no worker keeps its tasks `Pending`, so no Docker is needed here
//! (except for the worker's health).

mod support;

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use support::{ManagerProcess, Refusal, WorkerProcess, cube_command};

const TASKS: usize = 50;
const PAGE_BYTES: u64 = 4096;

/// A manager under `data_dir` holding `TASKS` pending tasks, stopped with SIGTERM; the IDs.
async fn stopped_manager_with_tasks(data_dir: &Path) -> Vec<String> {
    let manager = ManagerProcess::try_start(data_dir).expect("a fresh manager starts");
    let client = manager.client();
    let mut ids = Vec::new();
    for n in 0..TASKS {
        ids.push(
            client
                .submit(&json!({"Name": format!("task-{n}"), "Image": "cube-sample:latest"}))
                .await,
        );
    }
    ids.sort();
    assert!(manager.terminate(Duration::from_secs(10)).success());
    ids
}

fn store_file(data_dir: &Path) -> PathBuf {
    data_dir.join("manager.redb")
}

/// The IDs the manager lists, sorted.
async fn listed_ids(manager: &ManagerProcess) -> Vec<String> {
    let tasks = manager.client().get("/tasks").await.body;
    let mut ids: Vec<String> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["ID"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// A refusal as an operator should meet it: a plain error exit (not a panic's 101), one
/// `cube:` line naming the file, and nothing that looks like a crash.
fn assert_refused_naming(refusal: &Refusal, file: &Path) {
    assert_eq!(
        refusal.status.code(),
        Some(1),
        "a refusal, not a crash: {refusal:?}"
    );
    assert!(
        !refusal.stderr.contains("panicked at"),
        "no panic printed: {}",
        refusal.stderr
    );
    let error_lines: Vec<&str> = refusal
        .stderr
        .lines()
        .filter(|line| line.starts_with("cube: "))
        .collect();
    assert_eq!(error_lines.len(), 1, "one error line: {}", refusal.stderr);
    assert!(
        error_lines[0].contains(&file.display().to_string()),
        "names the file: {}",
        error_lines[0]
    );
    assert!(
        error_lines[0].contains("cube store restore"),
        "says what to do: {}",
        error_lines[0]
    );
}

#[tokio::test]
async fn a_manager_whose_store_file_was_emptied_refuses_to_start_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    stopped_manager_with_tasks(dir.path()).await;
    std::fs::File::create(store_file(dir.path())).unwrap();

    let refusal = ManagerProcess::try_start(dir.path())
        .err()
        .expect("an emptied store is refused, not started empty");
    assert_refused_naming(&refusal, &store_file(dir.path()));
    assert!(refusal.stderr.contains("empty"), "{}", refusal.stderr);
    assert_eq!(
        std::fs::metadata(store_file(dir.path())).unwrap().len(),
        0,
        "nothing new was written into it"
    );
}

#[tokio::test]
async fn a_manager_whose_store_file_was_cut_in_half_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    stopped_manager_with_tasks(dir.path()).await;
    let file = store_file(dir.path());
    let length = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(length / 2)
        .unwrap();

    let refusal = ManagerProcess::try_start(dir.path())
        .err()
        .expect("a store cut in half is refused");
    assert_refused_naming(&refusal, &file);
}

/// Overwrites seeded pages of a stopped manager's file, one page per start: each start is
/// refused with the file named, or (when the page held nothing in use) serves every task and
/// takes writes. Never a panic, never a process that listens but cannot write.
#[tokio::test]
async fn a_manager_with_one_page_overwritten_refuses_to_start_or_serves_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let pristine_dir = dir.path().join("pristine");
    let ids = stopped_manager_with_tasks(&pristine_dir).await;
    let pristine = store_file(&pristine_dir);
    let pages = std::fs::metadata(&pristine).unwrap().len() / PAGE_BYTES;
    let mut random = SplitMix64(0xC0BE);
    // The header page, and a bounded sample of the others.
    let mut chosen: Vec<u64> = vec![0];
    chosen.extend((0..9).map(|_| 1 + random.next() % (pages - 1)));

    let (mut refused, mut served) = (0, 0);
    for page in chosen {
        let data_dir = dir.path().join(format!("page-{page}"));
        std::fs::create_dir_all(&data_dir).unwrap();
        let file = store_file(&data_dir);
        std::fs::copy(&pristine, &file).unwrap();
        let garbage: Vec<u8> = (0..PAGE_BYTES).map(|_| random.next() as u8).collect();
        let mut opened = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        opened.seek(SeekFrom::Start(page * PAGE_BYTES)).unwrap();
        opened.write_all(&garbage).unwrap();
        drop(opened);

        match ManagerProcess::try_start(&data_dir) {
            Err(refusal) => {
                assert_refused_naming(&refusal, &file);
                refused += 1;
            }
            Ok(manager) => {
                assert_eq!(listed_ids(&manager).await, ids, "page {page}: every task");
                let client = manager.client();
                let written = client
                    .post(&json!({"Name": "after", "Image": "cube-sample:latest"}))
                    .await;
                assert_eq!(
                    written.status, 201,
                    "page {page}: writes work: {}",
                    written.body
                );
                assert_eq!(client.get("/health").await.status, 200);
                assert!(manager.terminate(Duration::from_secs(10)).success());
                served += 1;
            }
        }
    }
    eprintln!("{refused} refused, {served} served every task");
    assert!(refused > 0, "the header page at least is noticed");
}

#[tokio::test]
async fn a_worker_whose_store_file_is_empty_refuses_to_start_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker-w-empty.redb");
    std::fs::File::create(&file).unwrap();
    let (status, _, stderr) = cube_command(&[
        "worker",
        "-p",
        "0",
        "-n",
        "w-empty",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_refused_naming(&Refusal { status, stderr }, &file);
}

#[tokio::test]
async fn health_answers_ok_on_a_manager_and_a_worker_whose_stores_are_sound() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::try_start(dir.path()).unwrap();
    let health = manager.client().get("/health").await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(health.body["Status"], "ok");
    assert!(health.body["Revision"].is_u64(), "{}", health.body);

    let worker = WorkerProcess::fresh("health");
    let health = worker.client().get("/health").await;
    assert_eq!((health.status, health.body), (200, json!({"Status": "ok"})));
}

#[tokio::test]
async fn a_backup_taken_while_the_manager_runs_restores_into_a_new_data_dir_with_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let running_dir = dir.path().join("running");
    let ids = stopped_manager_with_tasks(&running_dir).await;
    let manager = ManagerProcess::try_start(&running_dir).unwrap();
    let backup = dir.path().join("backup.redb");

    let (status, stdout, stderr) = cube_command(&[
        "store",
        "backup",
        backup.to_str().unwrap(),
        "--from-manager",
        &manager.address(),
    ]);
    assert!(status.success(), "backup: {stderr}");
    assert!(stdout.contains("backed up"), "{stdout}");

    // The manager holds its file: a restore over it is refused and changes nothing.
    let (status, _, stderr) = cube_command(&[
        "store",
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        running_dir.to_str().unwrap(),
    ]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stop the manager first"), "{stderr}");
    assert_eq!(listed_ids(&manager).await, ids);

    let restored_dir = dir.path().join("restored");
    let (status, _, stderr) = cube_command(&[
        "store",
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        restored_dir.to_str().unwrap(),
    ]);
    assert!(status.success(), "restore: {stderr}");
    let restored = ManagerProcess::try_start(&restored_dir).unwrap();
    assert_eq!(listed_ids(&restored).await, ids);
}

#[tokio::test]
async fn a_damaged_store_is_replaced_by_a_restore_and_the_damaged_file_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let ids = stopped_manager_with_tasks(&data_dir).await;
    let backup = dir.path().join("offline.redb");
    let (status, _, stderr) = cube_command(&[
        "store",
        "backup",
        backup.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    assert!(status.success(), "offline backup: {stderr}");
    std::fs::File::create(store_file(&data_dir)).unwrap();

    let (status, stdout, stderr) = cube_command(&[
        "store",
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    assert!(status.success(), "restore: {stderr}");
    assert!(stdout.contains("before-restore"), "{stdout}");
    let manager = ManagerProcess::try_start(&data_dir).unwrap();
    assert_eq!(listed_ids(&manager).await, ids);
}

#[tokio::test]
async fn a_damaged_backup_is_not_restored_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let ids = stopped_manager_with_tasks(&data_dir).await;
    let backup = dir.path().join("garbage.redb");
    std::fs::write(&backup, vec![0x5a; 64 * 1024]).unwrap();

    let (status, _, stderr) = cube_command(&[
        "store",
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nothing was changed"), "{stderr}");
    let manager = ManagerProcess::try_start(&data_dir).unwrap();
    assert_eq!(listed_ids(&manager).await, ids);
}

/// A crash is not damage: a manager killed (SIGKILL) while writes stream in starts again on
/// its file, three times over, with every task it acknowledged.
#[tokio::test]
async fn a_manager_killed_while_writing_starts_again_with_every_acknowledged_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut acknowledged: Vec<String> = Vec::new();
    for round in 0..3 {
        let manager = ManagerProcess::try_start(dir.path())
            .unwrap_or_else(|refusal| panic!("round {round}: refused after a crash: {refusal:?}"));
        let listed = listed_ids(&manager).await;
        for id in &acknowledged {
            assert!(listed.contains(id), "round {round}: task {id} lost");
        }
        // Writers keep submitting until the kill cuts them off; the kill lands while some are
        // in flight. Every answer before it is a 201 (anything else is a defect, not a crash),
        // and a writer may stop only once the kill has begun: a writer that stopped early
        // would leave the kill to land on fewer writes than the test claims.
        let client = std::sync::Arc::new(manager.client());
        let killing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|writer| {
                let (client, killing) = (client.clone(), killing.clone());
                tokio::spawn(async move {
                    let killed = || killing.load(std::sync::atomic::Ordering::SeqCst);
                    let mut ids = Vec::new();
                    for n in 0.. {
                        let body = json!({"Name": format!("r{round}-w{writer}-{n}"), "Image": "cube-sample:latest"});
                        let sent = client.http.post(format!("{}/tasks", client.base)).body(body.to_string()).send().await;
                        let response = match sent {
                            Ok(response) => response,
                            Err(err) => {
                                assert!(killed(), "round {round}: writer {writer} stopped before the kill: {err:?}");
                                return ids;
                            }
                        };
                        let status = response.status();
                        let answer = response.text().await;
                        assert_eq!(status, 201, "round {round}: writer {writer}: {answer:?}");
                        // A 201 whose body the kill cut off was never acknowledged to the user.
                        let Ok(answer) = answer else {
                            assert!(killed(), "round {round}: writer {writer}: an answer cut off before the kill");
                            return ids;
                        };
                        let task: serde_json::Value = serde_json::from_str(&answer).unwrap();
                        ids.push(task["ID"].as_str().unwrap().to_string());
                    }
                    ids
                })
            })
            .collect();
        while manager
            .client()
            .get("/tasks")
            .await
            .body
            .as_array()
            .unwrap()
            .len()
            < listed.len() + 40
        {
            tokio::task::yield_now().await;
        }
        killing.store(true, std::sync::atomic::Ordering::SeqCst);
        manager.kill_9();
        for writer in writers {
            acknowledged.extend(writer.await.unwrap());
        }
    }
    let manager = ManagerProcess::try_start(dir.path()).expect("starts after the last crash");
    let listed = listed_ids(&manager).await;
    for id in &acknowledged {
        assert!(listed.contains(id), "task {id} lost");
    }
}

/// The seeded generator that picks pages and garbage, so every run damages the same bytes.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
