//! The two byte loops the scanner spends its time in, 16 bytes at a time where the target has
//! wasm SIMD (Envoy's V8 and wasmtime both do) and 8 at a time (SWAR on u64) elsewhere.
//!
//! Nearly all of a chat request is string content, so finding the next byte that ends or
//! interrupts a string is the scanner's hot path.

/// Index of the first byte at or after `from` that is `"`, `\` or a control byte (< 0x20),
/// or `b.len()` if there is none.
#[inline]
pub fn find_string_special(b: &[u8], from: usize) -> usize {
    imp::find_string_special(b, from)
}

/// The closing quote of a short plain string: when the string content from `from` reaches its
/// closing quote within [`PLAIN_SPAN`] bytes with nothing before it but printable ASCII (no
/// escape, control or non-ASCII byte), the quote's index; otherwise `None` and the caller takes
/// the full walk ([`skip_string`]). Keys and most scalar strings of a request (`"role"`,
/// `"user"`, a model name) are such strings: one or two loads decide them, where the full walk
/// sets up its 64-byte blocks and checks UTF-8 apart.
#[inline(always)]
pub fn plain_string_end(b: &[u8], from: usize) -> Option<usize> {
    imp::plain_string_end(b, from)
}

/// How far [`plain_string_end`] looks.
pub const PLAIN_SPAN: usize = 32;

/// Index of the first `\r` or `\n` at or after `from`, or `b.len()` if there is none (the
/// end of a server-sent-events line).
#[inline]
pub fn find_line_end(b: &[u8], from: usize) -> usize {
    imp::find_line_end(b, from)
}

/// Whether some `"` in `b` has `word` right before it (the raw end of a key `word`): the
/// quotes are found 16 bytes at a time where the target has SIMD, and only they are compared.
#[inline]
pub fn quote_after(b: &[u8], word: &[u8]) -> bool {
    imp::quote_after(b, word)
}

/// Where a walk over string content ([`skip_string`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk<E> {
    /// The closing quote is at this index: every special byte before it passed `special` and
    /// the content before it is valid UTF-8.
    Quote(usize),
    /// The bytes ran out first. The content is valid UTF-8 before `unchecked` (a character
    /// boundary, up to `b.len()`); what follows was not checked, because only the caller knows
    /// whether the body ends there (a sequence cut at the end is then invalid) or goes on.
    End { unchecked: usize },
    /// `special` failed at a byte; the content before that byte is valid UTF-8.
    Special(E),
    /// Invalid UTF-8 at this index, before any byte `special` refused.
    BadUtf8(usize),
}

/// Walks string content from `from` (just after the opening quote, or any character boundary in
/// it that is not inside an escape) to the closing quote without decoding it, checking UTF-8 on
/// the way. `special(j)` is called for every `\\` or control byte at `j` and returns where to
/// resume (after the escape) or an error. The first problem by offset wins: a UTF-8 error is
/// reported only if no earlier byte failed `special`, and a `special` error only if the content
/// before it is valid UTF-8.
///
/// With SIMD, one 16-byte load yields the positions of every special byte in the block, and the
/// escapes in it are handled from that bitmask without reloading: chat text escapes `\n` and `\"`
/// every few dozen bytes, so not restarting the search per escape is most of the speed. UTF-8 is
/// checked in the same pass: the test that finds control bytes in a block also finds non-ASCII
/// ones, and only stretches holding non-ASCII bytes go to the validator, so the bytes of an ASCII
/// prompt are loaded once (the validator used to be a separate pass over the whole body).
#[inline]
pub fn skip_string<E>(
    b: &[u8],
    from: usize,
    special: impl FnMut(usize) -> Result<usize, E>,
) -> Walk<E> {
    imp::skip_string(b, from, special)
}

/// `then`, unless the string content `b[pend..to]` holds invalid UTF-8. `to` is a quote, a
/// backslash or a control byte (ASCII), so a sequence it cuts is invalid.
#[inline(always)]
fn checked<E>(b: &[u8], pend: usize, to: usize, then: Walk<E>) -> Walk<E> {
    if pend < to {
        if let Err(n) = validate_utf8(&b[pend..to]) {
            return Walk::BadUtf8(pend + n);
        }
    }
    then
}

/// `Err(n)` where `n` is the length of the longest valid UTF-8 prefix (what
/// `std::str::from_utf8(b).unwrap_err().valid_up_to()` reports), `Ok` if `b` is valid UTF-8.
///
/// Runs of ASCII are skipped 16 (SIMD) or 8 (SWAR) bytes at a time; std validates only the
/// stretches around non-ASCII bytes, in windows of 64 bytes. A sequence cut by a window's end is
/// re-validated from its first byte in the next window, so the answer equals std's on the whole.
pub fn validate_utf8(b: &[u8]) -> Result<(), usize> {
    const WINDOW: usize = 64;
    let mut i = 0;
    loop {
        i = imp::skip_ascii(b, i);
        if i >= b.len() {
            return Ok(());
        }
        let end = (i + WINDOW).min(b.len());
        match core::str::from_utf8(&b[i..end]) {
            Ok(_) => i = end,
            // Incomplete at the window's end (not the body's): at most 3 bytes are cut, so
            // valid_up_to >= WINDOW - 3 and the loop moves on.
            Err(e) if e.error_len().is_none() && end < b.len() => i += e.valid_up_to(),
            Err(e) => return Err(i + e.valid_up_to()),
        }
    }
}

#[inline(always)]
fn is_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod imp {
    use super::{is_special, Walk};
    use core::arch::wasm32::*;

    #[inline]
    pub fn find_string_special(b: &[u8], from: usize) -> usize {
        let mut i = from;
        let quote = u8x16_splat(b'"');
        let bslash = u8x16_splat(b'\\');
        let space = u8x16_splat(0x20);
        while i + 16 <= b.len() {
            // SAFETY: i + 16 <= len, and v128_load has no alignment requirement.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            let hits = v128_or(
                v128_or(u8x16_eq(v, quote), u8x16_eq(v, bslash)),
                u8x16_lt(v, space),
            );
            let mask = u8x16_bitmask(hits);
            if mask != 0 {
                return i + mask.trailing_zeros() as usize;
            }
            i += 16;
        }
        while i < b.len() && !is_special(b[i]) {
            i += 1;
        }
        i
    }

    pub fn quote_after(b: &[u8], word: &[u8]) -> bool {
        let Some(&last) = word.last() else {
            return b.contains(&b'"');
        };
        let quote = u8x16_splat(b'"');
        let end = u8x16_splat(last);
        let ends = |j: usize| j >= word.len() && &b[j - word.len()..j] == word;
        // Only quotes right after the word's last byte are compared: in JSON most quotes end a
        // key or value that ends otherwise. `carry`: the previous block's last byte was it.
        let mut carry = 0u32;
        let mut i = 0;
        while i + 16 <= b.len() {
            // SAFETY: i + 16 <= len, and v128_load has no alignment requirement.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            let lasts = u32::from(u8x16_bitmask(u8x16_eq(v, end)));
            let mut mask = u32::from(u8x16_bitmask(u8x16_eq(v, quote))) & ((lasts << 1) | carry);
            carry = lasts >> 15;
            while mask != 0 {
                if ends(i + mask.trailing_zeros() as usize) {
                    return true;
                }
                mask &= mask - 1;
            }
            i += 16;
        }
        (i..b.len()).any(|j| b[j] == b'"' && ends(j))
    }

    #[inline]
    pub fn find_line_end(b: &[u8], from: usize) -> usize {
        let mut i = from;
        let lf = u8x16_splat(b'\n');
        let cr = u8x16_splat(b'\r');
        while i + 16 <= b.len() {
            // SAFETY: i + 16 <= len, and v128_load has no alignment requirement.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            let mask = u8x16_bitmask(v128_or(u8x16_eq(v, lf), u8x16_eq(v, cr)));
            if mask != 0 {
                return i + mask.trailing_zeros() as usize;
            }
            i += 16;
        }
        while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
            i += 1;
        }
        i
    }

    /// Where a walk over string content stopped.
    enum Step {
        /// The closing quote.
        Quote(usize),
        /// The first token boundary at or after the requested stop.
        At(usize),
    }

    #[inline(always)]
    pub fn plain_string_end(b: &[u8], from: usize) -> Option<usize> {
        let mut i = from;
        while i + 16 <= b.len() && i < from + super::PLAIN_SPAN {
            // SAFETY: i + 16 <= len, and v128_load has no alignment requirement.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            // Special or non-ASCII (the sign bit): the first such byte must be the quote.
            let stop = special16(v) | u8x16_bitmask(v) as u32;
            if stop != 0 {
                let j = i + stop.trailing_zeros() as usize;
                return (b[j] == b'"').then_some(j);
            }
            i += 16;
        }
        None
    }

    /// Bitmask of the lanes of `v` that are '"', '\\' or < 0x20.
    #[inline(always)]
    fn special16(v: v128) -> u32 {
        let hits = v128_or(
            v128_or(
                u8x16_eq(v, u8x16_splat(b'"')),
                u8x16_eq(v, u8x16_splat(b'\\')),
            ),
            u8x16_lt(v, u8x16_splat(0x20)),
        );
        u8x16_bitmask(hits) as u32
    }

    /// 16 bytes per load, each special byte handled from the bitmask; stops at the closing
    /// quote or at the first token boundary at or after `stop` (`At(b.len())` at the end).
    /// A failing `special` comes back with the byte it failed at. `pend` is lowered to the start
    /// of the first 16 bytes (or the byte) holding a non-ASCII byte, as in `skip_string`.
    #[inline(always)]
    fn walk16<E>(
        b: &[u8],
        from: usize,
        stop: usize,
        pend: &mut usize,
        special: &mut impl FnMut(usize) -> Result<usize, E>,
    ) -> Result<Step, (usize, E)> {
        let mut i = from;
        'block: while i < stop && i + 16 <= b.len() {
            // SAFETY: i + 16 <= len, and v128_load has no alignment requirement.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            if u8x16_bitmask(v) != 0 {
                *pend = (*pend).min(i);
            }
            let mut mask = special16(v);
            while mask != 0 {
                let j = i + mask.trailing_zeros() as usize;
                if b[j] == b'"' {
                    return Ok(Step::Quote(j));
                }
                let next = special(j).map_err(|e| (j, e))?;
                let skip = next - i;
                if skip >= 16 {
                    i = next;
                    continue 'block;
                }
                // Bits of bytes the escape consumed (or that precede it) are done.
                mask &= !0u32 << skip;
            }
            i += 16;
        }
        while i < stop && i < b.len() {
            let c = b[i];
            if c == b'"' {
                return Ok(Step::Quote(i));
            }
            if c >= 0x80 {
                *pend = (*pend).min(i);
            }
            i = if is_special(c) {
                special(i).map_err(|e| (i, e))?
            } else {
                i + 1
            };
        }
        Ok(Step::At(i))
    }

    /// 64 bytes per step without a branch per escape (the odd-backslash-run technique of
    /// simdjson): which bytes are escaped, which quote is real, and whether every escape in the
    /// block is a plain two-byte one (`\n`, `\"`, ...) with no control byte before the closing
    /// quote. A block that is anything else (`\u`, an error) is walked by `walk16` instead, which
    /// hands each special byte to `special`, so errors and `\u` handling are exactly that path's.
    ///
    /// UTF-8: `pend` is where content not yet checked, and holding non-ASCII bytes, starts
    /// (`NONE` while every byte walked since the last check is ASCII). A block with a non-ASCII
    /// byte sets it (to the block's start, a character boundary since the bytes before are
    /// ASCII); the next all-ASCII block checks `b[pend..]` up to itself (any sequence its first
    /// byte cuts is invalid), and so does the end of the string. An English prompt never calls
    /// the validator; text with non-ASCII bytes is checked once, by stretches.
    #[inline]
    pub fn skip_string<E>(
        b: &[u8],
        from: usize,
        mut special: impl FnMut(usize) -> Result<usize, E>,
    ) -> Walk<E> {
        const EVEN: u64 = 0x5555_5555_5555_5555;
        const NONE: usize = usize::MAX;
        let mut i = from;
        // 1 when the byte at `i` is escaped by a backslash at `i - 1`.
        let mut prev: u64 = 0;
        let mut pend = NONE;
        // LLVM emits each splat as a `v128.const` inside the loop and V8 builds it there on every
        // pass (several instructions each); values LLVM cannot see through are loop-invariant
        // locals instead, which V8 keeps in registers or reloads with one load.
        let [quote_c, bslash_c, n_c, t_c, space_c, ctrl_max_c] = core::hint::black_box([
            u8x16_splat(b'"'),
            u8x16_splat(b'\\'),
            u8x16_splat(b'n'),
            u8x16_splat(b't'),
            u8x16_splat(0x20),
            u8x16_splat(0x1F),
        ]);
        while i + 64 <= b.len() {
            // SAFETY: i + 64 <= len; v128_load has no alignment requirement.
            let p = unsafe { b.as_ptr().add(i) };
            let v = unsafe {
                [
                    v128_load(p as *const v128),
                    v128_load(p.add(16) as *const v128),
                    v128_load(p.add(32) as *const v128),
                    v128_load(p.add(48) as *const v128),
                ]
            };
            let quote = v.map(|x| u8x16_eq(x, quote_c));
            let bslash = v.map(|x| u8x16_eq(x, bslash_c));
            let bs = bits(bslash);
            let quotes = bits(quote);
            // Chat text escapes `\n`, `\"`, `\\` and `\t` nearly always: classifying those in
            // the vectors leaves no per-escape loop (whose varying trip count mispredicts) in
            // the common block; the other escapes are looked up one by one below.
            // (The quotes and backslashes are in their bitmasks already: only `n` and `t` are
            // compared and extracted again.)
            let common = quotes | bs | bits(v.map(|x| v128_or(u8x16_eq(x, n_c), u8x16_eq(x, t_c))));
            // Control bytes are rare inside strings (but common just after one, in pretty-printed
            // JSON), and so are non-ASCII bytes in most prompts. Read as signed bytes, both are
            // below 0x20 (non-ASCII ones are negative): one compare tests the block for either,
            // and which kind and where only when there are some. (`i8x16.gt_s` is one x64
            // instruction, as the `u8x16_sub_sat` this replaced was.)
            let low = i8x16_min(i8x16_min(v[0], v[1]), i8x16_min(v[2], v[3]));
            let (ctrl, wide) = if v128_any_true(i8x16_gt(space_c, low)) {
                let high = v128_or(v128_or(v[0], v[1]), v128_or(v[2], v[3]));
                (
                    bits(v.map(|x| u8x16_eq(u8x16_min(x, ctrl_max_c), x))),
                    u8x16_bitmask(high) != 0,
                )
            } else {
                (0, false)
            };
            if wide {
                pend = pend.min(i);
            } else if pend != NONE {
                // An all-ASCII block ends whatever multi-byte text came before it.
                if let Err(n) = super::validate_utf8(&b[pend..i]) {
                    return Walk::BadUtf8(pend + n);
                }
                pend = NONE;
            }
            // Escaped bytes: the byte after each backslash that is not itself escaped.
            let bs_start = bs & !prev;
            let follows = (bs_start << 1) | prev;
            let odd_starts = bs_start & !EVEN & !follows;
            let (seq_even, carry) = odd_starts.overflowing_add(bs_start);
            let escaped = (EVEN ^ (seq_even << 1)) & follows;
            let real = quotes & !escaped;
            // Bytes before the closing quote (all 64 if there is none in this block).
            let before = if real == 0 {
                !0
            } else {
                (real & real.wrapping_neg()) - 1
            };
            let mut rare = escaped & before & !common;
            let mut plain = ctrl & before == 0;
            while plain && rare != 0 {
                let k = i + rare.trailing_zeros() as usize;
                plain = SIMPLE[b[k] as usize];
                rare &= rare - 1;
            }
            if plain {
                if real != 0 {
                    let q = i + real.trailing_zeros() as usize;
                    return super::checked(b, pend, q, Walk::Quote(q));
                }
                prev = carry as u64;
                i += 64;
                continue;
            }
            // Start at the backslash if the block's first byte is escaped.
            match walk16(b, i - prev as usize, i + 64, &mut pend, &mut special) {
                Ok(Step::Quote(q)) => return super::checked(b, pend, q, Walk::Quote(q)),
                Ok(Step::At(next)) => {
                    i = next;
                    prev = 0;
                }
                Err((j, e)) => return super::checked(b, pend, j, Walk::Special(e)),
            }
        }
        match walk16(b, i - prev as usize, b.len(), &mut pend, &mut special) {
            Ok(Step::Quote(q)) => super::checked(b, pend, q, Walk::Quote(q)),
            Ok(Step::At(_)) => Walk::End {
                unchecked: pend.min(b.len()),
            },
            Err((j, e)) => super::checked(b, pend, j, Walk::Special(e)),
        }
    }

    /// One bit per lane of four 16-lane compare results, lane `k` of vector `n` at bit `16n + k`.
    #[inline(always)]
    fn bits(m: [v128; 4]) -> u64 {
        (u8x16_bitmask(m[0]) as u64)
            | (u8x16_bitmask(m[1]) as u64) << 16
            | (u8x16_bitmask(m[2]) as u64) << 32
            | (u8x16_bitmask(m[3]) as u64) << 48
    }

    /// The bytes that may follow a backslash as a two-byte escape.
    static SIMPLE: [bool; 256] = {
        let mut t = [false; 256];
        let simple = *b"\"\\/bfnrt";
        let mut k = 0;
        while k < simple.len() {
            t[simple[k] as usize] = true;
            k += 1;
        }
        t
    };

    /// Index of the first byte >= 0x80 at or after `from`, or `b.len()`.
    #[inline]
    pub fn skip_ascii(b: &[u8], from: usize) -> usize {
        let mut i = from;
        while i + 64 <= b.len() {
            // SAFETY: i + 64 <= len.
            let p = unsafe { b.as_ptr().add(i) };
            let (v0, v1, v2, v3) = unsafe {
                (
                    v128_load(p as *const v128),
                    v128_load(p.add(16) as *const v128),
                    v128_load(p.add(32) as *const v128),
                    v128_load(p.add(48) as *const v128),
                )
            };
            if u8x16_bitmask(v128_or(v128_or(v0, v1), v128_or(v2, v3))) != 0 {
                break;
            }
            i += 64;
        }
        while i + 16 <= b.len() {
            // SAFETY: i + 16 <= len.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            let m = u8x16_bitmask(v);
            if m != 0 {
                return i + m.trailing_zeros() as usize;
            }
            i += 16;
        }
        while i < b.len() && b[i] < 0x80 {
            i += 1;
        }
        i
    }
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
mod imp {
    use super::{is_special, Walk};

    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;

    #[inline(always)]
    fn load(b: &[u8], i: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(w)
    }

    /// High bit set in each byte of `v` that is '"', '\\' or < 0x20. Bits above the lowest hit
    /// may be false positives (borrows); only the lowest is used.
    #[inline(always)]
    fn special_mask(v: u64) -> u64 {
        let quote = v ^ (LO * b'"' as u64);
        let bslash = v ^ (LO * b'\\' as u64);
        let has_quote = quote.wrapping_sub(LO) & !quote;
        let has_bslash = bslash.wrapping_sub(LO) & !bslash;
        let ctrl = v.wrapping_sub(LO * 0x20) & !v;
        (has_quote | has_bslash | ctrl) & HI
    }

    #[inline(always)]
    pub fn plain_string_end(b: &[u8], from: usize) -> Option<usize> {
        let end = b.len().min(from + super::PLAIN_SPAN);
        for (j, &c) in b.iter().enumerate().take(end).skip(from) {
            if c == b'"' {
                return Some(j);
            }
            if is_special(c) || c >= 0x80 {
                return None;
            }
        }
        None
    }

    #[inline]
    pub fn find_string_special(b: &[u8], from: usize) -> usize {
        let mut i = from;
        while i + 8 <= b.len() {
            let m = special_mask(load(b, i));
            if m != 0 {
                return i + (m.trailing_zeros() / 8) as usize;
            }
            i += 8;
        }
        while i < b.len() && !is_special(b[i]) {
            i += 1;
        }
        i
    }

    pub fn quote_after(b: &[u8], word: &[u8]) -> bool {
        (word.len()..b.len()).any(|j| b[j] == b'"' && &b[j - word.len()..j] == word)
    }

    #[inline]
    pub fn find_line_end(b: &[u8], from: usize) -> usize {
        let mut i = from;
        while i + 8 <= b.len() {
            let v = load(b, i);
            let lf = v ^ (LO * b'\n' as u64);
            let cr = v ^ (LO * b'\r' as u64);
            let m = ((lf.wrapping_sub(LO) & !lf) | (cr.wrapping_sub(LO) & !cr)) & HI;
            if m != 0 {
                return i + (m.trailing_zeros() / 8) as usize;
            }
            i += 8;
        }
        while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
            i += 1;
        }
        i
    }

    /// SWAR masks can flag bytes above the first hit falsely, so search again after each
    /// escape instead of reusing the mask. UTF-8 is checked over the whole walk at its end
    /// (this path only serves native builds: tests, fuzzing, tools).
    #[inline]
    pub fn skip_string<E>(
        b: &[u8],
        from: usize,
        mut special: impl FnMut(usize) -> Result<usize, E>,
    ) -> Walk<E> {
        let mut i = from;
        loop {
            i = find_string_special(b, i);
            match b.get(i) {
                None => return Walk::End { unchecked: from },
                Some(b'"') => return super::checked(b, from, i, Walk::Quote(i)),
                Some(_) => match special(i) {
                    Ok(next) => i = next,
                    Err(e) => return super::checked(b, from, i, Walk::Special(e)),
                },
            }
        }
    }

    #[inline]
    pub fn skip_ascii(b: &[u8], from: usize) -> usize {
        let mut i = from;
        while i + 8 <= b.len() {
            let m = load(b, i) & HI;
            if m != 0 {
                return i + (m.trailing_zeros() / 8) as usize;
            }
            i += 8;
        }
        while i < b.len() && b[i] < 0x80 {
            i += 1;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(b: &[u8], from: usize) -> usize {
        (from..b.len())
            .find(|&i| is_special(b[i]))
            .unwrap_or(b.len())
    }

    #[test]
    fn finds_a_quote_after_a_word_at_every_offset() {
        for pos in 0..40 {
            for quote in [true, false] {
                let mut b = vec![b'"'; 40];
                b[pos..(pos + 5).min(40)].copy_from_slice(&b"usage"[..(40 - pos).min(5)]);
                if !quote && pos + 5 < 40 {
                    b[pos + 5] = b'x';
                }
                let want = pos + 5 < 40 && quote;
                assert_eq!(quote_after(&b, b"usage"), want, "at {pos}, quote {quote}");
            }
        }
        assert!(!quote_after(b"\"sage\"", b"usage"));
    }

    #[test]
    fn finds_the_first_special_byte_at_every_offset() {
        // Every special and a selection of ordinary bytes (non-ASCII included) at each position
        // of a 40-byte window, so both the wide loop and the tail are exercised.
        let probes: Vec<u8> = (0u8..=0x21)
            .chain([b'\\', b'a', 0x7f, 0x80, 0xC3, 0xFF])
            .collect();
        for &p in &probes {
            for pos in 0..40 {
                let mut b = vec![b'x'; 40];
                b[pos] = p;
                for from in [0, 1, 7, 9, 17] {
                    assert_eq!(
                        find_string_special(&b, from),
                        naive(&b, from),
                        "byte {p:#x} at {pos} from {from}"
                    );
                }
            }
        }
        // Non-ASCII bytes never count as special, even right before a hit.
        let b = "ééééééééé\"".as_bytes();
        assert_eq!(find_string_special(b, 0), b.len() - 1);
    }

    #[test]
    fn a_plain_string_end_is_the_quote_after_printable_ascii_only() {
        // Each stop byte (quote, escape, control, non-ASCII) and an ordinary one at every
        // position around the 16-byte steps and the span's end, from several starts: a quote
        // found must be the string's end with only printable ASCII before it; `None` is always
        // allowed (the full walk decides).
        for p in [b'"', b'\\', 0x01, 0x1f, 0x80, 0xC3, 0xFF, b'a'] {
            for pos in 0..48 {
                for len in [pos + 1, pos + 3, 40, 48] {
                    let mut b = vec![b'x'; len.max(pos + 1)];
                    b[pos] = p;
                    for from in [0, 1, 5, 15, 16, 17] {
                        if from > b.len() {
                            continue;
                        }
                        let got = plain_string_end(&b, from);
                        let first_stop =
                            (from..b.len()).find(|&j| is_special(b[j]) || b[j] >= 0x80);
                        match got {
                            Some(q) => {
                                assert_eq!(
                                    Some(q),
                                    first_stop,
                                    "{p:#x} at {pos} of {len} from {from}"
                                );
                                assert_eq!(b[q], b'"');
                                assert!(q < from + PLAIN_SPAN);
                            }
                            None => {
                                // A quote within reach with nothing before it must be found
                                // where 16 bytes can be read past every block it sits in.
                                if let Some(q) = first_stop.filter(|&q| b[q] == b'"') {
                                    let reach = from + (q - from) / 16 * 16 + 16;
                                    assert!(
                                        q >= from + PLAIN_SPAN || reach > b.len(),
                                        "missed the quote at {q} ({len} bytes from {from})"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn finds_the_first_line_end_at_every_offset() {
        for p in [b'\n', b'\r', 0x0b, 0x0c, 0x8a, 0x8d, b'a'] {
            for pos in 0..40 {
                let mut b = vec![b'x'; 40];
                b[pos] = p;
                for from in [0, 1, 7, 9, 17, 39, 40] {
                    let want = (from..b.len())
                        .find(|&i| b[i] == b'\n' || b[i] == b'\r')
                        .unwrap_or(b.len());
                    assert_eq!(find_line_end(&b, from), want, "{p:#x} at {pos} from {from}");
                }
            }
        }
    }

    #[test]
    fn utf8_validation_agrees_with_std() {
        let std_says = |b: &[u8]| {
            std::str::from_utf8(b)
                .map(|_| ())
                .map_err(|e| e.valid_up_to())
        };
        // Every lead/continuation shape, placed at every offset around the 16/64-byte steps and
        // the 64-byte windows, with and without a cut at the end.
        let seqs: &[&[u8]] = &[
            "é".as_bytes(),
            "€".as_bytes(),
            "😀".as_bytes(),
            b"\x80",
            b"\xC3",
            b"\xC0\xAF",
            b"\xE0\x80\xAF",
            b"\xED\xA0\x80",
            b"\xF4\x90\x80\x80",
            b"\xF0\x9F\x98",
            b"\xFF",
        ];
        for s in seqs {
            for len in [0usize, 1, 15, 16, 17, 63, 64, 65, 130, 200] {
                for pos in (0..len.max(1)).step_by(1.max(len / 40)) {
                    let mut b = vec![b'a'; len];
                    b.splice(pos.min(len)..pos.min(len), s.iter().copied());
                    assert_eq!(validate_utf8(&b), std_says(&b), "{s:?} at {pos} of {len}");
                    b.truncate(b.len().saturating_sub(1));
                    assert_eq!(
                        validate_utf8(&b),
                        std_says(&b),
                        "{s:?} at {pos} of {len}, cut"
                    );
                }
            }
        }
        // Long runs of multi-byte text cross every window boundary at every phase.
        for pad in 0..8 {
            let mut b = vec![b'x'; pad];
            b.extend("日本語のテキスト😀é".repeat(40).as_bytes());
            assert_eq!(validate_utf8(&b), Ok(()));
            for cut in [1, 2, 3] {
                let c = &b[..b.len() - cut];
                assert_eq!(validate_utf8(c), std_says(c), "pad {pad} cut {cut}");
            }
            let mut bad = b.clone();
            let at = bad.len() / 2;
            bad[at] = 0xFF;
            assert_eq!(validate_utf8(&bad), std_says(&bad), "pad {pad}");
        }
    }

    /// A `special` for the tests: the two-byte escapes pass, anything else (`\u` included) is
    /// an error at its position, so a block that wrongly skips an escape shows up.
    fn two_byte_escape(b: &[u8], j: usize) -> Result<usize, usize> {
        match b.get(j + 1) {
            Some(c) if b[j] == b'\\' && b"\"\\/bfnrt".contains(c) => Ok(j + 2),
            _ => Err(j),
        }
    }

    /// Reference: where a string walk ends, each special byte judged by `two_byte_escape`, UTF-8
    /// checked over everything walked (so a `BadUtf8` before a failing byte wins).
    fn naive_skip(b: &[u8], from: usize) -> Walk<usize> {
        let utf8 = |to: usize, then: Walk<usize>| match std::str::from_utf8(&b[from..to]) {
            Err(e) => Walk::BadUtf8(from + e.valid_up_to()),
            Ok(_) => then,
        };
        let mut i = from;
        while i < b.len() {
            match b[i] {
                b'"' => return utf8(i, Walk::Quote(i)),
                c if is_special(c) => match two_byte_escape(b, i) {
                    Ok(next) => i = next,
                    Err(j) => return utf8(j, Walk::Special(j)),
                },
                _ => i += 1,
            }
        }
        utf8(b.len(), Walk::End { unchecked: b.len() })
    }

    /// A walk as its caller settles it at the end of a whole body: what was left unchecked is
    /// checked (so a wrong `unchecked`, one inside a character or past a bad byte, shows up).
    fn walk(b: &[u8], from: usize) -> Walk<usize> {
        match skip_string(b, from, |j| two_byte_escape(b, j)) {
            Walk::End { unchecked } => {
                assert!(
                    (from..=b.len()).contains(&unchecked),
                    "unchecked {unchecked}"
                );
                match validate_utf8(&b[unchecked..]) {
                    Err(n) => Walk::BadUtf8(unchecked + n),
                    Ok(()) => Walk::End { unchecked: b.len() },
                }
            }
            w => w,
        }
    }

    #[test]
    fn escapes_straddling_block_boundaries() {
        // Each escape shape at every offset around the 16- and 64-byte steps, runs of
        // backslashes of both parities included. The SIMD path tells the common escapes
        // (`\"`, `\\`, `\n`, `\t`) from the others (`\/`, `\r`, `\b`, `\u`, invalid) in
        // different ways, so both kinds are here.
        let units: &[&[u8]] = &[
            b"\\\"",
            b"\\\\",
            b"\\\\\\\"",
            b"\\\\\\\\",
            b"\\n",
            b"\\t",
            b"\\\\n",
            b"\\/",
            b"\\r",
            b"\\b",
            b"\\u00e9",
            b"\x01",
            b"\\\x01",
            b"\\q",
            b"\\u",
            // UTF-8 is checked in the same walk: valid sequences of each length, invalid and
            // cut ones, next to escapes, at every offset.
            "é".as_bytes(),
            "€".as_bytes(),
            "😀".as_bytes(),
            "é\\n".as_bytes(),
            "\\\"😀".as_bytes(),
            b"\xC3",
            b"\xE2\x82",
            b"\xF0\x9F\x98",
            b"\xFF",
            b"\xC0\xAF",
            b"\xED\xA0\x80",
            b"\xC3\\n",
            b"\x80\x01",
        ];
        for u in units {
            for pos in 0..150 {
                for tail in [0usize, 1, 70] {
                    let mut b = vec![b'a'; pos];
                    b.extend_from_slice(u);
                    b.extend(std::iter::repeat_n(b'a', tail));
                    b.push(b'"');
                    // A control byte right after the string (pretty-printed JSON) is not in it.
                    b.extend_from_slice(b"\n\tafter\"");
                    assert_eq!(
                        walk(&b, 0),
                        naive_skip(&b, 0),
                        "{u:?} at {pos}, tail {tail}"
                    );
                    // Non-ASCII text before the unit too (a pending stretch the unit ends).
                    let mut w = "日本".as_bytes().to_vec();
                    w.extend_from_slice(&b);
                    assert_eq!(
                        walk(&w, 0),
                        naive_skip(&w, 0),
                        "{u:?} at {pos}+6, tail {tail}"
                    );
                    // And no closing quote: the walk runs out inside the string.
                    let open = &b[..pos + u.len() + tail];
                    assert_eq!(walk(open, 0), naive_skip(open, 0), "{u:?} at {pos}, open");
                }
            }
        }
    }

    #[test]
    fn skip_string_agrees_with_a_byte_loop() {
        // Escapes as two-byte units (`\x`): `\"` and `\\` must not end the string or start
        // another escape; a control byte is an error at its position.
        let units: &[&[u8]] = &[
            b"a",
            b"\\\"",
            b"\\\\",
            b"\\n",
            b"\x01",
            b"\"",
            "é".as_bytes(),
            "😀".as_bytes(),
            b"\xC3",
            b"\xE2\x82\xAC",
        ];
        let mut seed = 0x2545F4914F6CDD1Du64;
        for _ in 0..4000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let n = (seed % 70) as usize;
            let mut b = Vec::new();
            let mut s = seed;
            for _ in 0..n {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Mostly plain bytes, so strings run across several blocks.
                let k = (s >> 33) as usize % 27;
                b.extend_from_slice(units[if k < units.len() { k } else { 0 }]);
            }
            for from in [0, 1, 3] {
                if from > b.len() {
                    continue;
                }
                assert_eq!(
                    walk(&b, from),
                    naive_skip(&b, from),
                    "{:?} from {from}",
                    String::from_utf8_lossy(&b)
                );
            }
        }
    }
}
