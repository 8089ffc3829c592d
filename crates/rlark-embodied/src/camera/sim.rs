//! The `sim` driver: a synthetic camera, so everything works without hardware.
//!
//! Each frame shows eight colour bars scrolling left (one full turn every 4 s) above a grey
//! ramp scrolling right, and burns in, top left on black, the frame's sequence number
//! (`#0000000042`) and its capture time (UTC, `HH:MM:SS.mmm`) in a 5x7 bitmap font scaled
//! with the image. [`read_counter`] reads the sequence number back from a decoded frame, so
//! tests can check frames end to end. Frames are paced by a timer at the camera's fps; when
//! rendering and encoding cannot keep up, ticks are skipped rather than bunched.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::time::{Interval, MissedTickBehavior};

use super::CameraError;
use super::capture::{RawFrame, Source};
use super::font::{self, ADVANCE, Canvas, GLYPH_HEIGHT, LINE_HEIGHT};

/// The eight bars, left to right: white, yellow, cyan, green, magenta, red, blue, black.
const BARS: [[u8; 3]; 8] = [
    [255, 255, 255],
    [255, 255, 0],
    [0, 255, 255],
    [0, 255, 0],
    [255, 0, 255],
    [255, 0, 0],
    [0, 0, 255],
    [0, 0, 0],
];

/// How long the bars take to scroll by one image width.
const SCROLL_PERIOD: Duration = Duration::from_secs(4);

/// Digits of the burned-in counter (it wraps after 10^10 frames).
const COUNTER_DIGITS: usize = 10;
/// Characters of the widest overlay line (`HH:MM:SS.mmm`).
const OVERLAY_CHARS: usize = 12;

/// Font unit in pixels for an image of this size: 1 up to 239 pixels on the short side,
/// then one more per 120.
fn overlay_scale(width: usize, height: usize) -> usize {
    (width.min(height) / 120).max(1)
}

/// Top-left corner of the overlay's first line of text.
fn text_origin(scale: usize) -> (usize, usize) {
    (3 * scale, 3 * scale)
}

/// Render the test pattern at `elapsed` since the camera opened, with `sequence` and
/// `captured` burned in. RGB8, `width * height * 3` bytes.
pub fn render(
    width: u32,
    height: u32,
    elapsed: Duration,
    sequence: u64,
    captured: SystemTime,
) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let offset = ((elapsed.as_secs_f64() / SCROLL_PERIOD.as_secs_f64()).fract() * w as f64)
        as usize
        % w.max(1);
    // Two distinct rows; every other row is a copy of one of them.
    let mut bars = Vec::with_capacity(w * 3);
    let mut ramp = Vec::with_capacity(w * 3);
    for x in 0..w {
        bars.extend_from_slice(&BARS[(x + offset) % w * BARS.len() / w]);
        let v = ((x + w - offset) % w * 255 / (w - 1).max(1)) as u8;
        ramp.extend_from_slice(&[v, v, v]);
    }
    let mut rgb = vec![0u8; w * h * 3];
    let bars_end = h * 3 / 4;
    for (y, row) in rgb.chunks_exact_mut(w * 3).enumerate() {
        row.copy_from_slice(if y < bars_end { &bars } else { &ramp });
    }

    let scale = overlay_scale(w, h);
    let (x0, y0) = text_origin(scale);
    let mut canvas = Canvas {
        rgb: &mut rgb,
        width: w,
        height: h,
    };
    canvas.fill(
        x0 - scale,
        y0 - scale,
        OVERLAY_CHARS * ADVANCE * scale + scale,
        LINE_HEIGHT * scale + GLYPH_HEIGHT * scale + 2 * scale,
        [0, 0, 0],
    );
    let counter = format!(
        "#{:0width$}",
        sequence % 10u64.pow(COUNTER_DIGITS as u32),
        width = COUNTER_DIGITS
    );
    canvas.text(x0, y0, scale, &counter, [255, 255, 255]);
    canvas.text(
        x0,
        y0 + LINE_HEIGHT * scale,
        scale,
        &clock(captured),
        [255, 255, 255],
    );
    rgb
}

/// `HH:MM:SS.mmm` (UTC) of `time`.
fn clock(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        since.subsec_millis()
    )
}

/// The sequence number burned into a sim frame (decoded to RGB8), modulo 10^10; `None` when
/// the image is too small to hold it or the digits cannot be read.
pub fn read_counter(rgb: &[u8], width: u32, height: u32) -> Option<u64> {
    let (w, h) = (width as usize, height as usize);
    if rgb.len() != w * h * 3 {
        return None;
    }
    let scale = overlay_scale(w, h);
    let (x0, y0) = text_origin(scale);
    let mut value = 0u64;
    // Character 0 is `#`.
    for i in 1..=COUNTER_DIGITS {
        let digit = font::read_digit(rgb, w, h, x0 + i * ADVANCE * scale, y0, scale)?;
        value = value * 10 + u64::from(digit);
    }
    Some(value)
}

/// A running sim camera.
pub(crate) struct SimSource {
    width: u32,
    height: u32,
    ticks: Interval,
    opened: Instant,
}

impl SimSource {
    pub(crate) fn new(width: u32, height: u32, fps: u32) -> SimSource {
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(fps.max(1))));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
        SimSource {
            width,
            height,
            ticks,
            opened: Instant::now(),
        }
    }
}

#[async_trait::async_trait]
impl Source for SimSource {
    async fn next_frame(&mut self, sequence: u64) -> Result<RawFrame, CameraError> {
        self.ticks.tick().await;
        let captured = SystemTime::now();
        let elapsed = self.opened.elapsed();
        let (width, height) = (self.width, self.height);
        let rgb =
            tokio::task::spawn_blocking(move || render(width, height, elapsed, sequence, captured))
                .await
                .map_err(|e| {
                    CameraError::Internal(format!("sim camera render task failed: {e}"))
                })?;
        Ok(RawFrame { rgb, captured })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burns_in_a_readable_counter_at_every_scale() {
        for (w, h) in [(80, 60), (160, 120), (320, 240), (640, 480), (1280, 720)] {
            let rgb = render(
                w,
                h,
                Duration::from_millis(1234),
                4_294_967_301,
                SystemTime::now(),
            );
            assert_eq!(rgb.len(), (w * h * 3) as usize);
            assert_eq!(read_counter(&rgb, w, h), Some(4_294_967_301), "{w}x{h}");
        }
    }

    #[test]
    fn the_pattern_moves() {
        let now = SystemTime::now();
        let a = render(160, 120, Duration::ZERO, 1, now);
        let b = render(160, 120, Duration::from_millis(500), 1, now);
        assert_ne!(a, b);
        // Tiny images render too (the overlay is clipped).
        assert_eq!(render(1, 1, Duration::from_secs(3), 7, now).len(), 3);
        assert_eq!(
            read_counter(&render(8, 8, Duration::ZERO, 7, now), 8, 8),
            None
        );
    }

    #[test]
    fn clock_is_utc_time_of_day() {
        let t = UNIX_EPOCH + Duration::from_millis(86_400_000 * 3 + 3_723_045);
        assert_eq!(clock(t), "01:02:03.045");
    }
}
