//! The release's pieces that can be proven in every test run: the workflow
//! trusts no action by a movable tag, a CLI archive packs the same bytes
//! every time, and krew installs the plugin from an archive and the
//! manifest made for it. The whole release (every platform, the image, the
//! signatures) is proven by `make release-dry-run`, which takes two static
//! release builds (deploy/release/release.sh).

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;
use support::paths::root;

/// `owner/repo[/path]@` and a full commit: a tag or a branch can be moved
/// to other code after review; a commit cannot.
fn pinned_to_a_commit(uses: &str) -> bool {
    let Some((action, commit)) = uses.split_once('@') else {
        return false;
    };
    action.split('/').count() >= 2
        && commit.len() == 40
        && commit.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[test]
fn every_action_is_pinned_to_a_commit() {
    assert!(!pinned_to_a_commit("actions/checkout@v4"), "a tag is not a pin");
    assert!(!pinned_to_a_commit("actions/checkout@main"), "a branch is not a pin");
    let dir = root().join(".github/workflows");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            let Some(uses) = line.trim_start().trim_start_matches("- ").strip_prefix("uses:") else {
                continue;
            };
            let (uses, comment) = uses.split_once('#').unwrap_or((uses, ""));
            let uses = uses.trim();
            assert!(
                pinned_to_a_commit(uses),
                "{}: {uses} is not pinned to a commit",
                path.display()
            );
            // The comment says which release the commit is, for the next update.
            assert!(
                comment.trim().starts_with('v'),
                "{}: {uses} does not name its release in a comment",
                path.display()
            );
            seen += 1;
        }
    }
    assert!(seen >= 8, "the workflows use {seen} actions: did the reader miss some?");
}

fn archive(args: &[&str]) -> String {
    let out = Command::new(root().join("deploy/release/archive.sh"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "archive.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The release's version: the crate's (host/tests/packaging.rs holds the
/// workspace, chart and policy to it).
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

const PLATFORMS: [&str; 4] = ["linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"];

/// Archives in `dir` for every platform the manifest names, with their
/// SHA256SUMS: `binary` for this machine's, a small stand-in for the rest
/// (only krew's own platform is installed and run).
fn packed(dir: &Path, binary: &Path) -> Vec<PathBuf> {
    let stand_in = dir.join("stand-in");
    std::fs::write(&stand_in, "#!/bin/sh\necho stand-in\n").unwrap();
    let archives: Vec<PathBuf> = PLATFORMS
        .iter()
        .map(|p| {
            let (os, arch) = p.split_once('/').unwrap();
            let file = if *p == format!("linux/{}", host_arch()) {
                binary
            } else {
                &stand_in
            };
            let out = archive(&["pack", file.to_str().unwrap(), os, arch, dir.to_str().unwrap()]);
            PathBuf::from(out.trim())
        })
        .collect();
    let sums: String = archives
        .iter()
        .map(|a| format!("{}  {}\n", sha256(a), a.file_name().unwrap().to_str().unwrap()))
        .collect();
    std::fs::write(dir.join("SHA256SUMS"), sums).unwrap();
    archives
}

/// This build's CLI without its symbols: what krew installs, at a size
/// that packs in seconds.
fn stripped_cli(dir: &Path) -> PathBuf {
    let copy = dir.join("config-snapshot");
    std::fs::copy(env!("CARGO_BIN_EXE_config-snapshot"), &copy).unwrap();
    let strip = Command::new("strip").arg(&copy).status().unwrap();
    assert!(strip.success());
    copy
}

#[test]
fn an_archive_packs_the_same_bytes_every_time() {
    let dir = TempDir::new("reproducible");
    let binary = dir.path().join("binary");
    std::fs::write(&binary, vec![7u8; 1 << 20]).unwrap();
    let first = packed(dir.path(), &binary);
    let sums: Vec<String> = first.iter().map(|a| sha256(a)).collect();
    // Another second on the clock, and files touched again, change nothing.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(&binary, vec![7u8; 1 << 20]).unwrap();
    let again = packed(dir.path(), &binary);
    assert_eq!(sums, again.iter().map(|a| sha256(a)).collect::<Vec<_>>());
    let listing = Command::new("tar").arg("-tzf").arg(&first[0]).output().unwrap();
    let mut names: Vec<&str> = std::str::from_utf8(&listing.stdout).unwrap().lines().collect();
    names.sort();
    // Named as the install doc extracts them (`tar -xzf ARCHIVE config-snapshot`).
    assert_eq!(names, ["LICENSE", "README.md", "config-snapshot"]);
    let out = dir.path().join("extracted");
    std::fs::create_dir_all(&out).unwrap();
    let extract = Command::new("tar")
        .arg("-xzf")
        .arg(&first[0])
        .arg("config-snapshot")
        .current_dir(&out)
        .status()
        .unwrap();
    assert!(extract.success(), "tar -xzf ARCHIVE config-snapshot (docs/install.md)");
    assert!(out.join("config-snapshot").exists());
}

/// The manifest lists every packed platform with its archive's checksum,
/// and krew (built from its module: deploy/release/tools.sh) installs the
/// plugin from the local archive under the name kubectl looks for.
#[test]
fn krew_installs_the_plugin_from_the_archive() {
    let dir = TempDir::new("krew");
    let cli = stripped_cli(dir.path());
    let archives = packed(dir.path(), &cli);
    let manifest = archive(&["krew", version(), dir.path().to_str().unwrap()]);
    let parsed: serde_json::Value = serde_yaml_ng::from_str(&manifest).unwrap();
    let platforms = parsed["spec"]["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 4, "{manifest}");
    for (platform, archive) in platforms.iter().zip(&archives) {
        let name = archive.file_name().unwrap().to_str().unwrap();
        assert!(platform["uri"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v{}/{name}", version())));
        assert_eq!(platform["sha256"].as_str().unwrap(), sha256(archive));
    }
    if Command::new("go").arg("version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the krew test: Go is needed to build krew"
        );
        eprintln!("Go is not installed: skipping krew's install");
        return;
    }
    let krew = Command::new(root().join("deploy/release/tools.sh"))
        .arg("krew")
        .output()
        .unwrap();
    assert!(krew.status.success(), "{}", String::from_utf8_lossy(&krew.stderr));
    let krew = String::from_utf8(krew.stdout).unwrap();
    let manifest_path = dir.path().join("config-snapshot.krew.yaml");
    std::fs::write(&manifest_path, &manifest).unwrap();
    let krew_root = dir.path().join("krew");
    let linux = archives
        .iter()
        .find(|a| a.to_str().unwrap().ends_with(&format!("linux-{}.tar.gz", host_arch())));
    let install = krew_install(krew.trim(), &krew_root, &manifest_path, linux.unwrap());
    assert!(
        install.status.success(),
        "krew install: {}",
        String::from_utf8_lossy(&install.stderr)
    );
    // kubectl runs `kubectl-config_snapshot` from PATH for `kubectl config-snapshot`.
    let plugin = krew_root.join("bin/kubectl-config_snapshot");
    let said = Command::new(&plugin).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8(said.stdout).unwrap().trim(),
        format!("config-snapshot {}", version())
    );

    // A well-formed archive that is not the one the manifest names for this
    // platform (another platform's) is refused on its checksum.
    let other = archives
        .iter()
        .find(|a| !a.to_str().unwrap().ends_with(&format!("linux-{}.tar.gz", host_arch())));
    let other = other.unwrap();
    let refused = krew_install(krew.trim(), &dir.path().join("krew-2"), &manifest_path, other);
    assert!(
        !refused.status.success(),
        "krew installed an archive whose checksum is not the manifest's"
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("checksum does not match"),
        "krew refused it for another reason: {said}"
    );
}

/// `krew install --manifest=… --archive=…` into `krew_root`, as a user
/// installs a plugin from files they downloaded.
fn krew_install(krew: &str, krew_root: &Path, manifest: &Path, archive: &Path) -> std::process::Output {
    Command::new(krew)
        .env("KREW_ROOT", krew_root)
        .stdin(std::process::Stdio::null())
        .arg("install")
        .arg(format!("--manifest={}", manifest.display()))
        .arg(format!("--archive={}", archive.display()))
        .output()
        .unwrap()
}

/// A directory of this test's own, removed when it ends.
struct TempDir(PathBuf);
impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cs-release-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn host_arch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "amd64"
    }
}

/// serve's image root (deploy/image/build.sh root) is the same bytes from
/// the same files, whenever it is made: files in a fixed order, times from
/// the commit, and the precompiled module the same for the same binary.
#[test]
fn an_image_root_is_the_same_bytes_every_time() {
    let dir = TempDir::new("image-root");
    let binary = env!("CARGO_BIN_EXE_config-snapshot");
    let platform = format!("linux/{}={binary}", host_arch());
    let root_of = |name: &str| {
        let out = dir.path().join(name);
        let made = Command::new(root().join("deploy/image/build.sh"))
            .args([
                "root",
                support::paths::policy().to_str().unwrap(),
                out.to_str().unwrap(),
                &platform,
            ])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "build.sh root: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        sha256(&out.join(format!("linux-{}.tar", host_arch())))
    };
    let first = root_of("first");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(first, root_of("again"));
}
