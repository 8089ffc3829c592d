//! Test support: deterministic input mutation for the parsers' mutation loops (the fuzz
//! targets' in-tree cousins, run by `cargo test`).

/// xorshift64*: deterministic, no dependency.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Apply one to four mutations to `input`: bit flips, byte sets, truncation, random
/// extension, a splice of another seed's prefix, or `hot` — the parser's interesting
/// bytes (a type byte, a header) set at random.
pub(crate) fn mutate(
    rng: &mut Rng,
    input: &mut Vec<u8>,
    seeds: &[&[u8]],
    hot: impl Fn(&mut Rng, &mut Vec<u8>),
) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] ^= 1 << rng.below(8);
            }
            1 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] = rng.next() as u8;
            }
            2 => input.truncate(rng.below(input.len() + 1)),
            3 => {
                for _ in 0..rng.below(9) {
                    input.push(rng.next() as u8);
                }
            }
            4 if !input.is_empty() => hot(rng, input),
            _ => {
                let other = seeds[rng.below(seeds.len())];
                let cut = rng.below(other.len() + 1);
                input.extend_from_slice(&other[..cut]);
            }
        }
    }
}
