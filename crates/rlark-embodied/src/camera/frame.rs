//! Captured frames and their encodings.
//!
//! A [`Frame`] holds the raw RGB8 image of one capture and encodes it lazily, at most once
//! per encoding: the capture loop encodes the camera's own encoding right away, and any
//! other encoding a client asks for is made by the first client that needs it and shared
//! (as [`Bytes`]) with everyone else reading the same frame.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::CameraError;
use crate::config::Encoding;

/// JPEG quality (1-100) of every encoded frame: visually clean for test patterns and
/// camera images at a fraction of the raw size.
pub const JPEG_QUALITY: u8 = 85;

impl Encoding {
    /// The name used in the configuration and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Jpeg => "jpeg",
            Encoding::Png => "png",
            Encoding::Raw => "raw",
        }
    }

    /// Parse an encoding name as a request gives it: `jpeg` (or `jpg`), `png`, `raw` (or
    /// `rgb8`), in any case.
    pub fn parse(name: &str) -> Result<Encoding, CameraError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "jpeg" | "jpg" => Ok(Encoding::Jpeg),
            "png" => Ok(Encoding::Png),
            "raw" | "rgb8" => Ok(Encoding::Raw),
            _ => Err(CameraError::InvalidArgument(format!(
                "encoding {name:?} is not supported (jpeg, png, raw)"
            ))),
        }
    }
}

/// One captured image. Immutable once published; shared by every reader as `Arc<Frame>`.
#[derive(Debug)]
pub struct Frame {
    /// The open session of the camera that captured it (a reopened camera starts a new one).
    pub session: u64,
    /// Counts the session's frames from 1.
    pub sequence: u64,
    /// Capture time, nanoseconds since the Unix epoch.
    pub timestamp_ns: i64,
    pub width: u32,
    pub height: u32,
    /// RGB8, row-major, no padding: `width * height * 3` bytes.
    rgb: Bytes,
    jpeg: OnceLock<Result<Bytes, CameraError>>,
    png: OnceLock<Result<Bytes, CameraError>>,
}

impl Frame {
    /// A frame of `rgb` (`width * height * 3` bytes, checked).
    pub fn new(
        session: u64,
        sequence: u64,
        timestamp_ns: i64,
        width: u32,
        height: u32,
        rgb: Bytes,
    ) -> Result<Frame, CameraError> {
        let expected = rgb_len(width, height);
        if rgb.len() != expected {
            return Err(CameraError::Internal(format!(
                "frame of {width}x{height} has {} bytes of RGB, expected {expected}",
                rgb.len()
            )));
        }
        Ok(Frame {
            session,
            sequence,
            timestamp_ns,
            width,
            height,
            rgb,
            jpeg: OnceLock::new(),
            png: OnceLock::new(),
        })
    }

    /// The raw RGB8 image.
    pub fn rgb(&self) -> &Bytes {
        &self.rgb
    }

    /// The frame in `encoding` if it needs no work now: raw always, others once encoded.
    pub fn ready(&self, encoding: Encoding) -> Option<Result<Bytes, CameraError>> {
        match encoding {
            Encoding::Raw => Some(Ok(self.rgb.clone())),
            Encoding::Jpeg => self.jpeg.get().cloned(),
            Encoding::Png => self.png.get().cloned(),
        }
    }

    /// The frame in `encoding`, encoding it now if nobody did yet (CPU-bound: call it off
    /// the async workers, or use [`encoded`]). Concurrent callers wait for one encoder.
    pub fn encode(&self, encoding: Encoding) -> Result<Bytes, CameraError> {
        match encoding {
            Encoding::Raw => Ok(self.rgb.clone()),
            Encoding::Jpeg => self
                .jpeg
                .get_or_init(|| encode_jpeg(&self.rgb, self.width, self.height))
                .clone(),
            Encoding::Png => self
                .png
                .get_or_init(|| encode_png(&self.rgb, self.width, self.height))
                .clone(),
        }
    }
}

/// `frame` in `encoding`: the shared bytes when already encoded, else encoded on the
/// blocking pool (once; see [`Frame::encode`]).
pub async fn encoded(frame: &Arc<Frame>, encoding: Encoding) -> Result<Bytes, CameraError> {
    if let Some(ready) = frame.ready(encoding) {
        return ready;
    }
    let frame = frame.clone();
    tokio::task::spawn_blocking(move || frame.encode(encoding))
        .await
        .map_err(|e| CameraError::Internal(format!("frame encoder task failed: {e}")))?
}

/// Bytes of an RGB8 image of this size.
pub fn rgb_len(width: u32, height: u32) -> usize {
    width as usize * height as usize * 3
}

/// Nanoseconds since the Unix epoch (0 before it, saturating far after it).
pub fn unix_nanos(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Baseline JPEG of an RGB8 image, [`JPEG_QUALITY`], 4:2:0 chroma.
pub fn encode_jpeg(rgb: &[u8], width: u32, height: u32) -> Result<Bytes, CameraError> {
    let (w, h) = match (u16::try_from(width), u16::try_from(height)) {
        (Ok(w), Ok(h)) => (w, h),
        _ => {
            return Err(CameraError::InvalidArgument(format!(
                "{width}x{height} is too large for JPEG (at most 65535 per side)"
            )));
        }
    };
    // A typical camera or test-pattern frame compresses to well under a tenth.
    let mut out = Vec::with_capacity(rgb.len() / 8 + 1024);
    let encoder = jpeg_encoder::Encoder::new(&mut out, JPEG_QUALITY);
    encoder
        .encode(rgb, w, h, jpeg_encoder::ColorType::Rgb)
        .map_err(|e| CameraError::Internal(format!("encode {width}x{height} JPEG: {e}")))?;
    Ok(Bytes::from(out))
}

/// PNG (RGB, 8 bits per channel) of an RGB8 image, with fast compression: camera frames are
/// read live, so speed matters more than the last few percent of size.
pub fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Bytes, CameraError> {
    let fail =
        |e: png::EncodingError| CameraError::Internal(format!("encode {width}x{height} PNG: {e}"));
    let mut out = Vec::with_capacity(rgb.len() / 2 + 1024);
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    let mut writer = encoder.write_header().map_err(fail)?;
    writer.write_image_data(rgb).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(width: u32, height: u32) -> Bytes {
        let mut rgb = Vec::with_capacity(rgb_len(width, height));
        for y in 0..height {
            for x in 0..width {
                rgb.extend_from_slice(&[(x * 255 / width) as u8, (y * 255 / height) as u8, 128]);
            }
        }
        Bytes::from(rgb)
    }

    #[test]
    fn encodes_once_and_shares() {
        let frame = Frame::new(1, 1, 0, 32, 16, gradient(32, 16)).expect("frame");
        assert!(frame.ready(Encoding::Jpeg).is_none());
        let jpeg = frame.encode(Encoding::Jpeg).expect("jpeg");
        assert_eq!(&jpeg[..2], &[0xFF, 0xD8]);
        let again = frame.ready(Encoding::Jpeg).expect("cached").expect("ok");
        // The same buffer, not a second encoding.
        assert_eq!(jpeg.as_ptr(), again.as_ptr());
        let png = frame.encode(Encoding::Png).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(frame.encode(Encoding::Raw).expect("raw").len(), 32 * 16 * 3);
    }

    #[test]
    fn rejects_a_wrong_buffer_size() {
        let e = Frame::new(1, 1, 0, 4, 4, Bytes::from(vec![0; 10])).expect_err("size");
        assert!(e.message().contains("expected 48"), "{e}");
    }

    #[test]
    fn parses_encodings() {
        assert_eq!(Encoding::parse("JPG"), Ok(Encoding::Jpeg));
        assert_eq!(Encoding::parse("raw"), Ok(Encoding::Raw));
        let e = Encoding::parse("h264").expect_err("unsupported");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("jpeg, png, raw"), "{e}");
    }
}
