//! `rlark embodied` and `rlark camera` as real processes: the runtime serves
//! `examples/embodied/sim.yaml` in a temporary socket directory, and the CLI lists, opens,
//! reads and closes the simulated camera `cam-0` through `camera-ctrl.sock`. Every wait is
//! bounded.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

const RLARK: &str = env!("CARGO_BIN_EXE_rlark");
const DEADLINE: Duration = Duration::from_secs(30);

async fn camera(socket_dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let run = tokio::process::Command::new(RLARK)
        .arg("camera")
        .arg("--socket-dir")
        .arg(socket_dir)
        .args(args)
        .stdin(Stdio::null())
        .output();
    tokio::time::timeout(DEADLINE, run)
        .await
        .with_context(|| format!("rlark camera {args:?} timed out"))?
        .context("run rlark camera")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn ok(output: Output, what: &str) -> anyhow::Result<String> {
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            stdout(&output),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(stdout(&output))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_camera_reads_the_sim_camera_of_rlark_embodied() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let socket_dir = dir.path().join("run");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/embodied/sim.yaml");
    let mut server = tokio::process::Command::new(RLARK)
        .arg("embodied")
        .arg("--config")
        .arg(&config)
        .arg("--socket-dir")
        .arg(&socket_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;

    // `list` works once the socket is up.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let list = loop {
        let output = camera(&socket_dir, &["list"]).await?;
        if output.status.success() {
            break stdout(&output);
        }
        if let Some(status) = server.try_wait()? {
            bail!("rlark embodied exited: {status}");
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "rlark camera list never succeeded: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut lines = list.lines();
    assert_eq!(
        lines.next(),
        Some("ID        TYPE      STATE     SIZE      FPS       ENCODING   NAME")
    );
    assert_eq!(
        lines.next(),
        Some("cam-0     sim       CLOSED    640x480   30        jpeg       cam-0")
    );

    // A frame of a closed camera is refused with the reason.
    let out = dir.path().join("f.jpg");
    let output = camera(
        &socket_dir,
        &["frame", "cam-0", "--out", out.to_str().context("path")?],
    )
    .await?;
    ensure!(
        !output.status.success(),
        "frame of a closed camera succeeded"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("FailedPrecondition"), "{stderr}");
    assert!(stderr.contains("not open"), "{stderr}");

    let opened = ok(camera(&socket_dir, &["open", "cam-0"]).await?, "open")?;
    assert_eq!(
        opened,
        "camera/cam-0 opened (OPEN, 640x480 at 30 fps, jpeg)\n"
    );

    let saved = ok(
        camera(
            &socket_dir,
            &["frame", "cam-0", "--out", out.to_str().context("path")?],
        )
        .await?,
        "frame",
    )?;
    assert!(
        saved.starts_with("camera/cam-0 frame ") && saved.contains("(640x480 jpeg, "),
        "{saved}"
    );
    let jpeg = std::fs::read(&out)?;
    // SOI at the start, EOI at the end, and a plausible size for a 640x480 test pattern.
    assert_eq!(&jpeg[..3], &[0xFF, 0xD8, 0xFF]);
    assert_eq!(&jpeg[jpeg.len() - 2..], &[0xFF, 0xD9]);
    assert!(
        (2_000..500_000).contains(&jpeg.len()),
        "{} bytes",
        jpeg.len()
    );

    let watched = ok(
        camera(&socket_dir, &["watch", "cam-0", "--count", "3"]).await?,
        "watch",
    )?;
    let sequences: Vec<u64> = watched
        .lines()
        .map(|line| {
            line.split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("bad watch line {line:?}"))
        })
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(sequences.len(), 3, "{watched}");
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{watched}");

    let closed = ok(camera(&socket_dir, &["close", "cam-0"]).await?, "close")?;
    assert_eq!(closed, "camera/cam-0 closed (CLOSED)\n");
    let info = ok(camera(&socket_dir, &["info", "cam-0"]).await?, "info")?;
    assert!(info.contains("state: CLOSED\n"), "{info}");

    server.start_kill()?;
    tokio::time::timeout(DEADLINE, server.wait()).await??;
    Ok(())
}
