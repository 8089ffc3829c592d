//! `rlark embodied` and `rlark camera` as real processes: the runtime serves
//! `examples/embodied/sim.yaml` in a temporary socket directory, and the CLI lists, opens,
//! reads and closes the simulated camera `cam-0` through `camera-ctrl.sock`. Every wait is
//! bounded.

use crate::embodied_common;
use anyhow::{Context as _, ensure};
use embodied_common::{DEADLINE, Embodied, ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_camera_reads_the_sim_camera_of_rlark_embodied() -> anyhow::Result<()> {
    let mut server = Embodied::start()?;
    // `list` works once the socket is up.
    let list = server.first_list("camera").await?;
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
    let scratch = tempfile::tempdir()?;
    let out = scratch.path().join("f.jpg");
    let output = server
        .cli(
            "camera",
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

    let opened = ok(server.cli("camera", &["open", "cam-0"]).await?, "open")?;
    assert_eq!(
        opened,
        "camera/cam-0 opened (OPEN, 640x480 at 30 fps, jpeg)\n"
    );

    let saved = ok(
        server
            .cli(
                "camera",
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
        server
            .cli("camera", &["watch", "cam-0", "--count", "3"])
            .await?,
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

    let closed = ok(server.cli("camera", &["close", "cam-0"]).await?, "close")?;
    assert_eq!(closed, "camera/cam-0 closed (CLOSED)\n");
    let info = ok(server.cli("camera", &["info", "cam-0"]).await?, "info")?;
    assert!(info.contains("state: CLOSED\n"), "{info}");

    server.process.start_kill()?;
    tokio::time::timeout(DEADLINE, server.process.wait()).await??;
    Ok(())
}
