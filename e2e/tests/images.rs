//! What is shipped is what is tested: `deploy/images/build.sh` (`make images`) builds the three
//! OCI archives, each is unpacked with umoci as a runtime would, and the whole system runs in
//! the fleet from the binaries inside the unpacked root filesystems.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::machines::{is_quota_denial, vsphere};
use e2e::system::{COMPONENT_CRATES, FleetWithSystem};
use e2e::{FleetSpec, wait_for};
use kkp_quota_crds::ResourceQuota;
use kube::Api;
use kube::api::PostParams;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn run(script: &str, args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(Path::new(ROOT).join(script))
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{script} {args:?} failed ({})", out.status);
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Whether the ELF file at `path` asks for a program interpreter (a dynamic executable does;
/// a static one, which runs on an empty root filesystem, does not).
fn has_interpreter(path: &Path) -> bool {
    let elf = std::fs::read(path).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "{} is not an ELF file", path.display());
    assert_eq!(elf[4], 2, "64-bit ELF expected");
    let u16_at = |o: usize| usize::from(u16::from_le_bytes([elf[o], elf[o + 1]]));
    let phoff = usize::try_from(u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap())).unwrap();
    let (entry_size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let header = phoff + i * entry_size;
        u32::from_le_bytes(elf[header..header + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(
                files(&path)
                    .into_iter()
                    .map(|p| Path::new(path.file_name().unwrap()).join(p)),
            );
        } else {
            out.push(PathBuf::from(path.file_name().unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_system_runs_from_its_unpacked_images() {
    run("deploy/images/build.sh", &[]);
    the_plugin_is_released_beside_them();
    let unpacked = tempfile::tempdir().unwrap();
    let bin = unpacked.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for component in COMPONENT_CRATES {
        let archive = Path::new(ROOT).join(format!("target/images/kkp-quota-{component}.oci.tar"));
        let bundle = unpacked.path().join(component);
        let rootfs = PathBuf::from(run(
            "deploy/images/unpack.sh",
            &[archive.to_str().unwrap(), bundle.to_str().unwrap()],
        ));
        // The binary and nothing else; static; run as 65532 with the binary as entrypoint.
        let binary = PathBuf::from(format!("usr/local/bin/{component}"));
        assert_eq!(
            files(&rootfs),
            std::slice::from_ref(&binary),
            "{component}'s image holds more than its binary"
        );
        assert!(
            !has_interpreter(&rootfs.join(&binary)),
            "{component} is not static"
        );
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap()).unwrap();
        let process = &config["process"];
        assert_eq!(
            process["args"][0],
            format!("/usr/local/bin/{component}"),
            "{process}"
        );
        assert_eq!(
            (&process["user"]["uid"], &process["user"]["gid"]),
            (&65532.into(), &65532.into())
        );
        std::os::unix::fs::symlink(rootfs.join(&binary), bin.join(component)).unwrap();
    }
    e2e::components::use_binaries_from(bin);

    let spec = FleetSpec::empty()
        .with_seed("seed-a")
        .with_project("demo")
        .with_user_cluster("alpha", "seed-a", "demo");
    let running = FleetWithSystem::start(spec).await.unwrap();
    let fleet = &running.fleet;
    for component in &running.system.components {
        let exe = std::fs::read_link(format!("/proc/{}/exe", component.pid())).unwrap();
        assert!(
            exe.starts_with(unpacked.path()),
            "{} runs {}",
            component.name,
            exe.display()
        );
    }
    e2e::demo::apply_quota(fleet, &e2e::demo::cpu_quota("demo", "2"), "images-test")
        .await
        .unwrap();
    let machines = e2e::machines::api(fleet, "alpha");
    let wait = Duration::from_mins(1);
    wait_for(
        wait,
        "the first Machine admitted once the quota is in force",
        || async {
            match machines.create(&PostParams::default(), &vsphere("fits", 2)).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Some(()),
                Err(_) => None,
            }
        },
    )
    .await
    .unwrap();
    let master = Api::<ResourceQuota>::all(fleet.master().client());
    wait_for(wait, "2 cpu in the master's globalUsage", || async {
        let usage = master.get("project-demo").await.ok()?.status?.global_usage?;
        (usage.cpu == Some("2".parse().unwrap())).then_some(())
    })
    .await
    .unwrap();
    let denied = machines
        .create(&PostParams::default(), &vsphere("too-many", 1))
        .await
        .unwrap_err();
    assert!(is_quota_denial(&denied, "demo"), "{denied}");
}

/// The kubectl plugin's archive holds the static binary alone, which runs; the krew manifest
/// beside it names that archive by its real sha256.
fn the_plugin_is_released_beside_them() {
    let images = Path::new(ROOT).join("target/images");
    let archive = images.join("kubectl-kkp_quota-linux-amd64.tar.gz");
    let unpacked = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(status.success(), "unpacking {}", archive.display());
    let binary = PathBuf::from("kubectl-kkp_quota");
    assert_eq!(files(unpacked.path()), std::slice::from_ref(&binary));
    assert!(
        !has_interpreter(&unpacked.path().join(&binary)),
        "the plugin is not static"
    );
    let version = std::process::Command::new(unpacked.path().join(&binary))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("kubectl kkp-quota {}", env!("CARGO_PKG_VERSION"))
    );
    let sha = std::process::Command::new("sha256sum")
        .arg(&archive)
        .output()
        .unwrap();
    let sha = String::from_utf8_lossy(&sha.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let manifest: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(images.join("kkp-quota.krew.yaml")).unwrap())
            .unwrap();
    let platform = &manifest["spec"]["platforms"][0];
    assert_eq!(platform["sha256"], sha.as_str(), "{manifest}");
    assert_eq!(platform["bin"], "kubectl-kkp_quota");
    assert!(
        platform["uri"]
            .as_str()
            .unwrap()
            .ends_with("/kubectl-kkp_quota-linux-amd64.tar.gz"),
        "{manifest}"
    );
    assert_eq!(
        manifest["spec"]["version"],
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
}
