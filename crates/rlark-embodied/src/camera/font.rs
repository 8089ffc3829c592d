//! A 5x7 bitmap font for the digits and the few signs the simulated camera burns into its
//! frames (frame counter and timestamp), and the matching reader that recognizes them again
//! in a decoded frame.

/// Glyph width and height in font units.
pub const GLYPH_WIDTH: usize = 5;
pub const GLYPH_HEIGHT: usize = 7;
/// Horizontal advance and line height in font units (one unit of spacing).
pub const ADVANCE: usize = GLYPH_WIDTH + 1;
pub const LINE_HEIGHT: usize = GLYPH_HEIGHT + 2;

/// Rows top to bottom; bit 4 is the leftmost column.
type Glyph = [u8; GLYPH_HEIGHT];

const DIGITS: [Glyph; 10] = [
    [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E], // 0
    [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E], // 1
    [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F], // 2
    [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E], // 3
    [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02], // 4
    [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E], // 5
    [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E], // 6
    [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08], // 7
    [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E], // 8
    [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C], // 9
];

/// The glyph of `c`; characters outside the font draw as blanks.
fn glyph(c: char) -> Glyph {
    match c {
        '0'..='9' => DIGITS[c as usize - '0' as usize],
        ':' => [0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C],
        '#' => [0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A],
        '-' => [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00],
        _ => [0; GLYPH_HEIGHT],
    }
}

/// An RGB8 image being drawn on.
pub struct Canvas<'a> {
    pub rgb: &'a mut [u8],
    pub width: usize,
    pub height: usize,
}

impl Canvas<'_> {
    /// Fill a rectangle (clipped to the image).
    pub fn fill(&mut self, x: usize, y: usize, w: usize, h: usize, color: [u8; 3]) {
        let x_end = (x + w).min(self.width);
        let y_end = (y + h).min(self.height);
        if x >= x_end {
            return;
        }
        for row in y..y_end {
            let start = (row * self.width + x) * 3;
            let end = (row * self.width + x_end) * 3;
            for px in self.rgb[start..end].chunks_exact_mut(3) {
                px.copy_from_slice(&color);
            }
        }
    }

    /// Draw `text` with its top-left corner at (`x`, `y`), each font unit `scale` pixels
    /// square, in `color` (clipped; the background is left as it is).
    pub fn text(&mut self, x: usize, y: usize, scale: usize, text: &str, color: [u8; 3]) {
        for (i, c) in text.chars().enumerate() {
            let glyph = glyph(c);
            let left = x + i * ADVANCE * scale;
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..GLYPH_WIDTH {
                    if bits & (0x10 >> col) != 0 {
                        self.fill(left + col * scale, y + row * scale, scale, scale, color);
                    }
                }
            }
        }
    }
}

/// Recognize the digit drawn (as by [`Canvas::text`]) at (`x`, `y`) with `scale`, reading
/// the centre pixel of every font unit as lit when it is bright. Tolerates up to two units
/// flipped by lossy compression; `None` when no digit is that close.
pub fn read_digit(
    rgb: &[u8],
    width: usize,
    height: usize,
    x: usize,
    y: usize,
    scale: usize,
) -> Option<u8> {
    let mut bits: Glyph = [0; GLYPH_HEIGHT];
    for (row, row_bits) in bits.iter_mut().enumerate() {
        for col in 0..GLYPH_WIDTH {
            let px = x + col * scale + scale / 2;
            let py = y + row * scale + scale / 2;
            if px >= width || py >= height {
                return None;
            }
            let i = (py * width + px) * 3;
            let luma = (u32::from(rgb[i]) * 299
                + u32::from(rgb[i + 1]) * 587
                + u32::from(rgb[i + 2]) * 114)
                / 1000;
            if luma >= 128 {
                *row_bits |= 0x10 >> col;
            }
        }
    }
    let distance =
        |g: &Glyph| -> u32 { g.iter().zip(&bits).map(|(a, b)| (a ^ b).count_ones()).sum() };
    let (best, d) = DIGITS
        .iter()
        .enumerate()
        .map(|(i, g)| (i, distance(g)))
        .min_by_key(|&(_, d)| d)?;
    // Digits differ from each other in at least 5 units (a test checks), so up to 2 flipped
    // units still decode to exactly one digit.
    (d <= 2).then_some(best as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_and_reads_every_digit() {
        let (width, height, scale) = (120, 20, 2);
        let mut rgb = vec![0u8; width * height * 3];
        let mut canvas = Canvas {
            rgb: &mut rgb,
            width,
            height,
        };
        canvas.text(1, 1, scale, "0123456789", [255, 255, 255]);
        for d in 0..10 {
            let x = 1 + d * ADVANCE * scale;
            assert_eq!(
                read_digit(&rgb, width, height, x, 1, scale),
                Some(d as u8),
                "digit {d}"
            );
        }
        // A blank cell is no digit.
        let blank = vec![0u8; width * height * 3];
        assert_eq!(read_digit(&blank, width, height, 1, 1, scale), None);
    }

    #[test]
    fn digits_are_far_apart() {
        for (i, a) in DIGITS.iter().enumerate() {
            for b in &DIGITS[i + 1..] {
                let d: u32 = a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum();
                assert!(d >= 5, "digit {i} is {d} units from another");
            }
        }
    }

    #[test]
    fn drawing_is_clipped() {
        let mut rgb = vec![0u8; 4 * 4 * 3];
        let mut canvas = Canvas {
            rgb: &mut rgb,
            width: 4,
            height: 4,
        };
        canvas.text(2, 2, 3, "88", [255, 0, 0]);
        canvas.fill(3, 3, 100, 100, [0, 255, 0]);
        assert_eq!(&rgb[(3 * 4 + 3) * 3..], &[0, 255, 0]);
    }
}
