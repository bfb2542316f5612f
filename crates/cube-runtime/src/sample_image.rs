//! Cube's sample image, built on this machine from a statically linked busybox.
//!
//! No registry can be assumed reachable, so the tests and the demo never pull: they import a
//! root filesystem holding Debian's `busybox-static` binary and its applet links. By default
//! the image serves `/www` with busybox `httpd` on port 7777 (the port of the book's echo
//! server), where `/health` answers 200 and any other missing path 404.

use std::path::{Path, PathBuf};

use bollard::body_full;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;

use crate::{DockerRuntime, RuntimeError};

/// The tag of the sample image.
pub const SAMPLE_IMAGE: &str = "cube-sample:latest";

/// The image of a pod's infra container: it only holds the pod's network namespace (as
/// Kubernetes' pause container does), and is built here, never pulled.
pub const PAUSE_IMAGE: &str = "cube-pause:latest";

/// The port the sample image's httpd listens on.
pub const SAMPLE_PORT: u16 = 7777;

/// Where a statically linked busybox is looked for when none is named.
const BUSYBOX_CANDIDATES: &[&str] = &["/bin/busybox", "/usr/bin/busybox"];

/// Applets linked in the image's `/bin`.
const APPLETS: &[&str] = &[
    "sh", "httpd", "sleep", "echo", "cat", "ls", "true", "false", "nc", "wget", "env", "kill",
    "ps", "touch", "rm",
];

const NO_BUSYBOX: &str = "install Debian's busybox-static (apt-get install -y busybox-static) or name \
                          a statically linked busybox with --busybox";

/// Finds a statically linked busybox: `explicit` when given, else the usual places.
pub fn find_static_busybox(explicit: Option<&Path>) -> Result<PathBuf, RuntimeError> {
    if let Some(path) = explicit {
        return check_static(path).map(|()| path.to_path_buf());
    }
    let mut reasons = Vec::new();
    for candidate in BUSYBOX_CANDIDATES {
        let path = Path::new(candidate);
        match check_static(path) {
            Ok(()) => return Ok(path.to_path_buf()),
            Err(RuntimeError::SampleImage(why)) if path.exists() => reasons.push(why),
            Err(_) => {}
        }
    }
    reasons.push(format!("no statically linked busybox found; {NO_BUSYBOX}"));
    Err(RuntimeError::SampleImage(reasons.join("; ")))
}

/// A dynamically linked busybox would not run in an image with no libc: refuse it by reading
/// the ELF program headers for an interpreter (`PT_INTERP`).
fn check_static(path: &Path) -> Result<(), RuntimeError> {
    let bytes = std::fs::read(path).map_err(|err| {
        RuntimeError::SampleImage(format!("cannot read {}: {err}", path.display()))
    })?;
    match elf_has_interpreter(&bytes) {
        Some(false) => Ok(()),
        Some(true) => Err(RuntimeError::SampleImage(format!(
            "{} is dynamically linked and cannot run in an empty image; {NO_BUSYBOX}",
            path.display()
        ))),
        None => Err(RuntimeError::SampleImage(format!(
            "{} is not a 64-bit ELF executable",
            path.display()
        ))),
    }
}

/// `Some(true)` when the 64-bit little-endian ELF in `bytes` names an interpreter.
fn elf_has_interpreter(bytes: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    let read_u16 = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    let read_u32 = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let read_u64 = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    let table = usize::try_from(read_u64(0x20)?).ok()?;
    let entry_size = usize::from(read_u16(0x36)?);
    let entries = usize::from(read_u16(0x38)?);
    for index in 0..entries {
        if read_u32(table + index * entry_size)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// The image's root filesystem as a tar archive.
fn root_filesystem(busybox: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut archive = tar::Builder::new(Vec::new());
    let directory = |mode: u32| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(mode);
        header.set_size(0);
        header
    };
    for (path, mode) in [
        ("bin", 0o755),
        ("www", 0o755),
        ("etc", 0o755),
        ("tmp", 0o1777),
    ] {
        archive.append_data(&mut directory(mode), path, std::io::empty())?;
    }
    let mut file = |path: &str, mode: u32, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        archive.append_data(&mut header, path, data)
    };
    file("bin/busybox", 0o755, busybox)?;
    file("www/health", 0o644, b"ok\n")?;
    file(
        "www/index.html",
        0o644,
        b"<h1>Hello from a Cube task</h1>\n",
    )?;
    file("etc/passwd", 0o644, b"root:x:0:0:root:/:/bin/sh\n")?;
    file("etc/group", 0o644, b"root:x:0:\n")?;
    for applet in APPLETS {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        archive.append_link(&mut header, format!("bin/{applet}"), "busybox")?;
    }
    archive.into_inner()
}

impl DockerRuntime {
    /// Imports the sample image under `tag` from `busybox`, replacing an older one. Returns
    /// the size of the root filesystem in bytes.
    pub async fn build_sample_image(&self, tag: &str, busybox: &Path) -> Result<u64, RuntimeError> {
        let changes = vec![
            "ENV PATH=/bin".to_string(),
            format!("EXPOSE {SAMPLE_PORT}/tcp"),
            format!(r#"CMD ["/bin/httpd", "-f", "-v", "-p", "{SAMPLE_PORT}", "-h", "/www"]"#),
        ];
        self.import_busybox_image(tag, busybox, changes).await
    }

    /// Builds the pods' infra image ([`PAUSE_IMAGE`]): the same root filesystem, whose command
    /// sleeps until it is stopped (docker-init, PID 1 in Cube's containers, forwards the stop).
    pub async fn ensure_pause_image(&self) -> Result<(), RuntimeError> {
        let busybox = find_static_busybox(None)?;
        let changes = vec![
            "ENV PATH=/bin".to_string(),
            r#"CMD ["/bin/sleep", "2147483647"]"#.to_string(),
        ];
        self.import_busybox_image(PAUSE_IMAGE, &busybox, changes)
            .await
            .map(|_| ())
    }

    async fn import_busybox_image(
        &self,
        tag: &str,
        busybox: &Path,
        changes: Vec<String>,
    ) -> Result<u64, RuntimeError> {
        check_static(busybox)?;
        let binary = std::fs::read(busybox).map_err(|err| {
            RuntimeError::SampleImage(format!("cannot read {}: {err}", busybox.display()))
        })?;
        let tarball = root_filesystem(&binary).map_err(|err| {
            RuntimeError::SampleImage(format!("cannot build the root filesystem: {err}"))
        })?;
        let size = tarball.len() as u64;
        let (repo, version) = tag
            .rsplit_once(':')
            .filter(|(_, v)| !v.contains('/'))
            .unwrap_or((tag, "latest"));
        let options = CreateImageOptionsBuilder::new()
            .from_src("-")
            .repo(repo)
            .tag(version)
            .changes(changes)
            .build();
        let mut progress =
            self.client()
                .create_image(Some(options), Some(body_full(tarball.into())), None);
        while let Some(step) = progress.next().await {
            step.map_err(|err| {
                RuntimeError::SampleImage(format!("docker import of {tag} failed: {err}"))
            })?;
        }
        Ok(size)
    }

    /// Builds the sample image unless `tag` is already present.
    pub async fn ensure_sample_image(&self, tag: &str) -> Result<(), RuntimeError> {
        if self.client().inspect_image(tag).await.is_ok() {
            return Ok(());
        }
        let busybox = find_static_busybox(None)?;
        self.build_sample_image(tag, &busybox).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_is_told_apart_from_a_static_one() {
        // This test binary itself is dynamically linked (it names ld-linux as interpreter).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_has_interpreter(&me), Some(true));
        assert_eq!(elf_has_interpreter(b"#!/bin/sh\necho not elf\n"), None);
    }

    #[test]
    fn the_root_filesystem_holds_busybox_its_applets_and_the_health_file() {
        let tarball = root_filesystem(b"fake busybox").unwrap();
        let mut archive = tar::Archive::new(tarball.as_slice());
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|entry| entry.unwrap().path().unwrap().display().to_string())
            .collect();
        for expected in ["bin/busybox", "bin/httpd", "bin/sh", "www/health", "tmp"] {
            assert!(
                names
                    .iter()
                    .any(|name| name.trim_end_matches('/') == expected),
                "{expected} in {names:?}"
            );
        }
    }
}
