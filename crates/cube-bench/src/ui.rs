//! `cube-bench ui`: the web UI's first render with many tasks, and what open tabs cost the
//! manager, in headless Chromium (Debian's, through chromedriver: `cube_test_support::Browser`).
//!
//! One `cube manager` holding `--tasks` Running tasks on simulated workers. First render:
//! a fresh navigation to `/ui` in a new tab, timed from the navigation's start (the page's
//! time origin) to the frame after the cluster page was first drawn with the first page of
//! tasks (the page's `performance.mark('cube-first-render')`), and to every task read and
//! counted (`cube-all-tasks`). Its peer, in the same run, in the same browser, from the same
//! origin: the two requests the page's first render waits for (`/nodes` and
//! `/tasks?summary=true&limit=500`) fetched and parsed by a bare page,
//! from its navigation's start to the last parse — what the data alone costs; the ratio is
//! the page's loading and drawing on top. Taking turns, `--runs` times.
//!
//! Open tabs: the manager's RSS with none, then with `--tabs` tabs each opened on the cluster
//! page (each live in its turn; a tab pauses its stream while hidden, so the one in front
//! follows the events), read once the manager has settled.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use cube_test_support::Browser;
use serde_json::json;

use crate::Summary;
use crate::load::{self, DbType, SimCluster};

const SIM_WORKERS: usize = 100;

/// The peer: the page's first two requests, fetched and parsed, timed from the navigation
/// start.
const FETCH_ONLY: &str = "
const done = arguments[arguments.length - 1];
Promise.all(['/nodes', '/tasks?summary=true&limit=500'].map((path) =>
  fetch(path).then((response) => response.json())))
  .then((lists) => done({ ms: performance.now(), tasks: lists[1].length }))
  .catch((err) => done({ error: String(err) }));
";

pub async fn ui(runs: usize, tasks: usize, tabs: usize, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    let SimCluster {
        _data_dir,
        manager,
        http,
        sim,
    } = SimCluster::start(cube, DbType::Persistent, SIM_WORKERS).await?;
    let base = manager.base.clone();
    load::load_tasks(&http, &base, "ui", 0, tasks).await?;
    load::await_running(&http, &base, tasks).await?;

    let browser = Browser::start().await;
    let mut page_ms = Vec::with_capacity(runs);
    let mut fetch_ms = Vec::with_capacity(runs);
    let mut ratios = Vec::with_capacity(runs);
    let mut all_ms = Vec::with_capacity(runs);
    for run in 0..runs {
        let (page, all) = first_render(&browser, &base, tasks).await?;
        let fetched = fetch_only(&browser, &base, tasks.min(500)).await?;
        eprintln!(
            "run {}: first render {page:.0} ms (every task counted at {all:.0} ms), its \
             requests alone {fetched:.0} ms",
            run + 1
        );
        browser.close_tab().await;
        browser.close_tab().await;
        page_ms.push(page);
        all_ms.push(all);
        fetch_ms.push(fetched);
        ratios.push(page / fetched);
    }

    // Open tabs: RSS with none (the measurement tabs are closed), then with `tabs` live
    // ones.
    let settle = Duration::from_secs(3);
    tokio::time::sleep(settle).await;
    let (before_mb, _) = load::memory_mb(manager.pid)?;
    for _ in 0..tabs {
        browser.new_tab().await;
        browser.open(&format!("{base}/ui")).await;
        browser
            .wait_for("#connection", "the live stream", |text| text == "live")
            .await;
    }
    tokio::time::sleep(settle).await;
    let (after_mb, peak_mb) = load::memory_mb(manager.pid)?;

    println!(
        "ui: the web UI in headless Chromium, a manager holding {tasks} Running tasks on \
         {SIM_WORKERS} simulated workers (redb store), {runs} runs taking turns"
    );
    println!();
    println!("| measure | median | min | max | target |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| first render of the cluster page, from the navigation's start, ms | {} | ≤ 300 |",
        Summary::of(&mut page_ms).spread(0)
    );
    println!(
        "| its first requests (the nodes and the first page of 500 tasks) fetched and parsed \
         alone, ms | {} | |",
        Summary::of(&mut fetch_ms).spread(0)
    );
    println!(
        "| ratio run by run, page / its requests alone | {} | |",
        Summary::of(&mut ratios).ratios()
    );
    println!(
        "| every task read (pages of 5,000 after the first) and counted, ms | {} | |",
        Summary::of(&mut all_ms).spread(0)
    );
    println!();
    println!("| manager RSS | MB | target |");
    println!("|---|---:|---:|");
    println!("| no UI tab open | {before_mb:.1} | |");
    println!(
        "| {tabs} tabs open (the one in front follows the events; hidden ones pause) | \
         {after_mb:.1} | |"
    );
    println!("| difference | {:+.1} | ≤ +10 |", after_mb - before_mb);
    println!("| peak (VmHWM) | {peak_mb:.1} | |");
    drop(browser);
    manager.kill().await?;
    sim.stop().await?;
    Ok(())
}

/// A fresh tab on `/ui`: ms from its navigation's start to the cluster page on screen (its
/// first page of tasks), and to every task read and counted.
async fn first_render(browser: &Browser, base: &str, tasks: usize) -> anyhow::Result<(f64, f64)> {
    browser.new_tab().await;
    browser.open(&format!("{base}/ui")).await;
    let running = tasks.to_string();
    browser
        .wait_for("#main .summary", "every task counted", |text| {
            text.lines().any(|line| line.trim() == running)
        })
        .await;
    let marks = browser
        .script(
            "const at = (name) => { const m = performance.getEntriesByName(name); \
             return m.length ? m[0].startTime : null; }; \
             return [at('cube-first-render'), at('cube-all-tasks')];",
            vec![],
        )
        .await;
    let first = marks[0]
        .as_f64()
        .context("the page set no first-render mark")?;
    let all = marks[1]
        .as_f64()
        .context("the page set no all-tasks mark")?;
    Ok((first, all))
}

/// A fresh tab on a bare page of the same origin fetching the page's first two requests.
async fn fetch_only(browser: &Browser, base: &str, tasks: usize) -> anyhow::Result<f64> {
    browser.new_tab().await;
    browser.open(&format!("{base}/health")).await;
    let answer = browser.script_async(FETCH_ONLY, vec![json!(null)]).await;
    if let Some(error) = answer["error"].as_str() {
        anyhow::bail!("the bare fetch failed: {error}");
    }
    anyhow::ensure!(
        answer["tasks"].as_u64() == Some(tasks as u64),
        "the bare fetch read {} tasks, not {tasks}",
        answer["tasks"]
    );
    answer["ms"].as_f64().context("no time from the bare fetch")
}
