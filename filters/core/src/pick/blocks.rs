//! Chained block hashes of a request's prompt.
//!
//! The prompt is what a chat template turns into the engine's token prefix: the tools, the system
//! prompt and the messages, all of them (several peers skip the tools, which in agent traffic are
//! most of the shared prefix). The bytes are the raw JSON values the scanner located
//! ([`crate::scan::TopLevel`] spans), so nothing is decoded or copied: the same request text gives
//! the same bytes on every gateway replica.
//!
//! Block `i` hashes its own bytes seeded with block `i - 1`'s hash, so equal hashes mean equal
//! prompts up to the end of that block. Only whole blocks are hashed: a shared prefix counts in
//! whole blocks, as the seed says. The hash is fixed (no per-process key) so that independent
//! replicas agree; a client that forges a collision only misroutes its own request.

use crate::scan::TopLevel;

/// Most blocks hashed per request: 4,096 blocks of the smallest size (256 B) is 1 MiB of prompt.
/// Bytes beyond are counted in [`Prompt::bytes`] but not hashed, which bounds the work per
/// request and the size of a ticket.
pub const MAX_BLOCKS: usize = 4096;

/// Smallest and largest block sizes the seed allows.
pub const MIN_BLOCK_BYTES: usize = 256;
pub const MAX_BLOCK_BYTES: usize = 16 * 1024;

/// A request's prompt as the picker sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    /// Chained hashes of the whole blocks, first block first (at most [`MAX_BLOCKS`]).
    pub blocks: Vec<u64>,
    /// Bytes of prompt in total, whole blocks and the tail alike.
    pub bytes: usize,
    /// Bytes of the parts every conversation of one application shares, the tools and the
    /// top-level system prompt ([`HEAD_PARTS`]), tags included: the conversation's own part
    /// (its messages) starts in block `head_bytes / block_bytes`. 0 without tools or a
    /// top-level system prompt (a system *message* is part of the messages).
    pub head_bytes: usize,
}

/// How many of [`prompt_parts`]' parts come before a conversation's own messages.
pub const HEAD_PARTS: usize = 2;

/// The prompt parts of a scanned body, in the order a chat template renders them. Parts the
/// request does not have are empty.
pub fn prompt_parts<'a>(body: &'a [u8], spans: &TopLevel) -> [&'a [u8]; 5] {
    let part = |s: Option<(usize, usize)>| match s {
        Some((a, b)) => body.get(a..b).unwrap_or(&[]),
        None => &[],
    };
    [
        part(spans.tools),
        part(spans.system),
        part(spans.messages),
        part(spans.prompt),
        part(spans.input),
    ]
}

/// Hashes `parts` (see [`prompt_parts`]) in blocks of `block_bytes` (clamped to the seed's
/// range), starting the chain from `seed` (one per backend, so two models never share blocks).
/// Each present part is preceded by a tag byte, so moving text from the system prompt into a
/// message is a different prompt. `out` is reused to avoid an allocation per request.
pub fn hash_prompt(parts: &[&[u8]], block_bytes: usize, seed: u64, out: &mut Prompt) {
    let block = block_bytes.clamp(MIN_BLOCK_BYTES, MAX_BLOCK_BYTES);
    out.blocks.clear();
    out.bytes = 0;
    out.head_bytes = 0;
    let mut chain = Chain {
        block,
        left: block,
        acc: seed,
        pending: 0,
        npending: 0,
        out: &mut out.blocks,
    };
    let mut bytes = 0usize;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        chain.feed(&[b'T' + i as u8]);
        chain.feed(part);
        bytes = bytes.saturating_add(1 + part.len());
        if i < HEAD_PARTS {
            out.head_bytes = bytes;
        }
    }
    out.bytes = bytes;
}

/// The streaming state: bytes are folded 8 at a time into `acc`; a block's end emits a hash and
/// seeds the next block with it.
struct Chain<'a> {
    block: usize,
    /// Bytes still missing from the current block.
    left: usize,
    acc: u64,
    /// Up to 7 bytes not yet folded, little-endian.
    pending: u64,
    npending: u32,
    out: &'a mut Vec<u64>,
}

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Chain<'_> {
    fn feed(&mut self, mut s: &[u8]) {
        while !s.is_empty() && self.out.len() < MAX_BLOCKS {
            let take = self.left.min(s.len());
            self.absorb(&s[..take]);
            s = &s[take..];
            self.left -= take;
            if self.left == 0 {
                self.end_block();
            }
        }
    }

    #[inline]
    fn word(&mut self, w: u64) {
        self.acc = (self.acc ^ w).wrapping_mul(K).rotate_left(29);
    }

    fn absorb(&mut self, mut s: &[u8]) {
        while self.npending != 0 && !s.is_empty() {
            self.pending |= (s[0] as u64) << (8 * self.npending);
            self.npending += 1;
            s = &s[1..];
            if self.npending == 8 {
                let w = self.pending;
                self.word(w);
                self.pending = 0;
                self.npending = 0;
            }
        }
        let mut words = s.chunks_exact(8);
        for c in &mut words {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        for &b in words.remainder() {
            self.pending |= (b as u64) << (8 * self.npending);
            self.npending += 1;
        }
    }

    fn end_block(&mut self) {
        if self.npending != 0 {
            let w = self.pending ^ ((self.npending as u64) << 59);
            self.word(w);
            self.pending = 0;
            self.npending = 0;
        }
        let h = mix(self.acc ^ self.block as u64);
        self.out.push(h);
        self.acc = h;
        self.left = self.block;
    }
}

/// splitmix64's finalizer: every input bit moves every output bit.
#[inline]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, for short identifiers (pod addresses, session keys): fixed, so every replica and
/// worker computes the same value.
pub(crate) fn fnv64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::Scanner;

    fn blocks(parts: &[&[u8]], block: usize) -> Prompt {
        let mut p = Prompt::default();
        hash_prompt(parts, block, 7, &mut p);
        p
    }

    #[test]
    fn only_whole_blocks_are_hashed_and_bytes_counts_all() {
        let text = vec![b'a'; 256 * 3 + 100];
        let p = blocks(&[&text[..]], 256);
        // One tag byte precedes the part.
        assert_eq!(p.bytes, text.len() + 1);
        assert_eq!(p.blocks.len(), 3);
        assert_eq!(blocks(&[&text[..200]], 256).blocks.len(), 0);
    }

    #[test]
    fn a_block_hash_covers_everything_before_it() {
        let mut a = vec![b'x'; 1024];
        let b = a.clone();
        a[3] = b'y';
        let pa = blocks(&[&a], 256);
        let pb = blocks(&[&b], 256);
        // Blocks 1..4 have equal bytes but a different past: all differ.
        for i in 0..4 {
            assert_ne!(pa.blocks[i], pb.blocks[i], "block {i}");
        }
        // A longer prompt with the same start shares the start's blocks.
        let mut longer = b.clone();
        longer.extend_from_slice(&[b'z'; 600]);
        let pl = blocks(&[&longer], 256);
        assert_eq!(&pl.blocks[..4], &pb.blocks[..]);
        assert_eq!(pl.blocks.len(), 6);
    }

    #[test]
    fn the_cut_between_parts_does_not_matter_within_a_part_but_the_part_does() {
        let text: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 23) as u8).collect();
        // One part fed whole equals the same bytes split at any point by the hasher itself.
        for block in [256, 300, 1000, 1024] {
            let whole = blocks(&[&text], block);
            let mut again = Prompt::default();
            hash_prompt(&[&text], block, 7, &mut again);
            assert_eq!(whole, again);
        }
        // The same bytes in the system prompt instead of the tools: another prompt.
        let e: &[u8] = &[];
        let as_tools = blocks(&[&text, e, e], 256);
        let as_system = blocks(&[e, &text, e], 256);
        assert_ne!(as_tools.blocks[0], as_system.blocks[0]);
        // The seed separates backends.
        let mut other = Prompt::default();
        hash_prompt(&[&text], 256, 8, &mut other);
        assert_ne!(other.blocks[0], as_tools.blocks[0]);
    }

    #[test]
    fn block_sizes_are_clamped_and_blocks_bounded() {
        let text = vec![b'q'; MAX_BLOCKS * 256 + 5000];
        let p = blocks(&[&text], 1);
        assert_eq!(p.blocks.len(), MAX_BLOCKS, "clamped to 256 B and capped");
        assert_eq!(p.bytes, text.len() + 1);
        assert_eq!(blocks(&[&text[..40_000]], 1 << 20).blocks.len(), 2);
    }

    #[test]
    fn parts_come_from_the_scanner_spans() {
        let tools = r#"[{"type":"function","function":{"name":"f"}}]"#;
        let body = format!(
            r#"{{"model":"m","tools":{tools},"messages":[{{"role":"user","content":"{}"}}]}}"#,
            "w".repeat(700)
        );
        let f = Scanner::new().scan(body.as_bytes()).unwrap();
        let parts = prompt_parts(body.as_bytes(), &f.spans);
        assert_eq!(parts[0], tools.as_bytes());
        assert!(parts[1].is_empty());
        assert!(parts[2].starts_with(b"[{\"role\""));
        // Key order and whitespace outside the prompt do not change the blocks.
        let moved = format!(
            r#"{{"messages":[{{"role":"user","content":"{}"}}],  "tools":{tools}, "model":"other"}}"#,
            "w".repeat(700)
        );
        let g = Scanner::new().scan(moved.as_bytes()).unwrap();
        let a = blocks(&parts, 256);
        let b = blocks(&prompt_parts(moved.as_bytes(), &g.spans), 256);
        assert_eq!(a, b);
        assert_eq!(a.blocks.len(), 3);
    }
}
