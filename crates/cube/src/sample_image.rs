//! `cube sample-image`: builds the local image the demo and the tests run.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use cube_runtime::DockerRuntime;
use cube_runtime::sample_image::{SAMPLE_IMAGE, SAMPLE_PORT, find_static_busybox};

/// Build Cube's sample image from a statically linked busybox, with no registry.
///
/// The image serves /www with busybox httpd on port 7777: GET /health answers 200 and any
/// other missing path 404. Needs Debian's busybox-static (apt-get install -y busybox-static).
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  cube sample-image && docker run --rm -d -p 7777:7777 cube-sample:latest\n  \
    curl -s localhost:7777/health"
)]
pub struct SampleImageArgs {
    /// The image tag to create.
    #[arg(long, default_value = SAMPLE_IMAGE)]
    tag: String,
    /// A statically linked busybox (default: /bin/busybox from busybox-static).
    #[arg(long)]
    busybox: Option<PathBuf>,
}

pub async fn run(args: SampleImageArgs) -> anyhow::Result<()> {
    let busybox = find_static_busybox(args.busybox.as_deref())?;
    let docker = DockerRuntime::connect().await?;
    let size = docker
        .build_sample_image(&args.tag, &busybox)
        .await
        .with_context(|| format!("building {} from {}", args.tag, busybox.display()))?;
    println!(
        "built {} ({} KiB, from {}); it serves /health on port {SAMPLE_PORT}",
        args.tag,
        size / 1024,
        busybox.display()
    );
    Ok(())
}
