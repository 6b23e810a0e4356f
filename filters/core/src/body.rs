//! A body read piece by piece as the gateway receives it, parsed as it arrives.
//!
//! Only the bytes the parser may read again are kept between pieces (a cut key, number or
//! escape; usually nothing), so memory holds about one piece per in-flight request rather than
//! the body. The request scanner is one such parser; a response-side usage parser is another.

use crate::scan::{Fields, ScanError, Scanner};

/// A parser that resumes over a sliding window of the body.
pub trait Resumable {
    type Output;
    type Error;
    /// Parses on with `window` = the body from offset `base` on (so far; `complete` when the
    /// body ends there). `Ok(None)`: not done yet.
    fn resume_window(
        &mut self,
        window: &[u8],
        base: usize,
        complete: bool,
    ) -> Result<Option<Self::Output>, Self::Error>;
    /// The first body offset the parser may still read.
    fn needed_from(&self) -> usize;
}

impl Resumable for Scanner {
    type Output = Fields;
    type Error = ScanError;
    fn resume_window(
        &mut self,
        window: &[u8],
        base: usize,
        complete: bool,
    ) -> Result<Option<Fields>, ScanError> {
        Scanner::resume_window(self, window, base, complete)
    }
    fn needed_from(&self) -> usize {
        Scanner::needed_from(self)
    }
}

/// The window a [`Resumable`] parser reads, and how much of the body has been read.
pub struct BodyWindow<P> {
    parser: P,
    window: Vec<u8>,
    /// The body offset of `window[0]`.
    base: usize,
    seen: usize,
}

impl<P: Resumable> BodyWindow<P> {
    pub fn new(parser: P) -> Self {
        BodyWindow {
            parser,
            window: Vec::new(),
            base: 0,
            seen: 0,
        }
    }

    /// Body bytes read so far: the next piece starts here.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Bytes kept for the parser to read again.
    pub fn retained(&self) -> usize {
        self.window.len()
    }

    /// Parses the next `piece` (the body bytes from [`BodyWindow::seen`] on). A piece usually
    /// becomes the window as it is, so the bytes the host copied in are parsed where they
    /// landed and then freed (copying them again would cost as much as the scan).
    pub fn feed(&mut self, piece: Vec<u8>, complete: bool) -> Result<Option<P::Output>, P::Error> {
        let start = self.seen;
        self.seen += piece.len();
        let window = if self.window.is_empty() {
            self.base = start;
            piece
        } else {
            let mut w = std::mem::take(&mut self.window);
            w.extend_from_slice(&piece);
            w
        };
        self.parse(window, complete)
    }

    /// Where the next piece is best read from when the host still holds the body (a gateway
    /// buffering it does): the first byte kept for the parser, else the first new one.
    pub fn read_from(&self) -> usize {
        if self.window.is_empty() {
            self.seen
        } else {
            self.base
        }
    }

    /// Parses `piece`: the body bytes from [`BodyWindow::read_from`] on, so the few bytes kept
    /// from the last piece (a cut token) come again at its head and the piece becomes the window
    /// as it is. [`BodyWindow::feed`] appends a piece to kept bytes instead, a copy of the whole
    /// piece: in wasm, about two instructions per byte, most of what a scan of that piece costs.
    pub fn feed_read(
        &mut self,
        piece: Vec<u8>,
        complete: bool,
    ) -> Result<Option<P::Output>, P::Error> {
        self.base = self.read_from();
        self.window = Vec::new();
        self.seen = self.seen.max(self.base + piece.len());
        self.parse(piece, complete)
    }

    /// Parses `window` (the body from `base` on) and keeps what the parser may read again.
    fn parse(&mut self, window: Vec<u8>, complete: bool) -> Result<Option<P::Output>, P::Error> {
        let out = self.parser.resume_window(&window, self.base, complete)?;
        let keep = self.parser.needed_from().clamp(self.base, self.seen);
        if keep < self.seen && out.is_none() {
            let mut w = window;
            w.drain(..keep - self.base);
            self.window = w;
            self.base = keep;
        }
        Ok(out)
    }
}

impl BodyWindow<Box<Scanner>> {
    /// A request-body scan from the first byte.
    pub fn scan() -> Self {
        let mut s = Box::new(Scanner::new());
        s.begin();
        BodyWindow::new(s)
    }
}

impl<P: Resumable + ?Sized> Resumable for Box<P> {
    type Output = P::Output;
    type Error = P::Error;
    fn resume_window(
        &mut self,
        window: &[u8],
        base: usize,
        complete: bool,
    ) -> Result<Option<P::Output>, P::Error> {
        (**self).resume_window(window, base, complete)
    }
    fn needed_from(&self) -> usize {
        (**self).needed_from()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(body: &[u8], cuts: &[usize]) -> (Result<Option<Fields>, ScanError>, usize) {
        let mut w = BodyWindow::scan();
        let mut at = 0;
        let mut max_kept = 0;
        for &cut in cuts {
            match w.feed(body[at..cut].to_vec(), false) {
                Ok(None) => {}
                other => return (other, max_kept),
            }
            max_kept = max_kept.max(w.retained());
            at = cut;
        }
        let out = w.feed(body[at..].to_vec(), true);
        assert_eq!(w.seen(), body.len());
        (out, max_kept)
    }

    #[test]
    fn every_cut_gives_the_whole_body_answer() {
        let body = br#"{"messages":[{"role":"user","content":"a \"quoted\" \u00e9 text"}],"temperature":0.25,"model":"qwen3-8b","stream":true}"#;
        let whole = Scanner::new().scan(body);
        for a in 0..=body.len() {
            for b in a..=body.len() {
                let (got, _) = pieces(body, &[a, b]);
                assert_eq!(got.map(Option::unwrap), whole, "cuts {a} {b}");
            }
        }
    }

    /// [`pieces`], each piece read from [`BodyWindow::read_from`] of the body as a host keeps it.
    fn pieces_read(body: &[u8], cuts: &[usize], every: bool) -> Result<Option<Fields>, ScanError> {
        let mut w = BodyWindow::scan();
        if every {
            w.parser.look_at_every_piece();
        }
        for &cut in cuts {
            let from = w.read_from();
            assert!(from <= w.seen() && w.seen() - from == w.retained());
            match w.feed_read(body[from..cut.max(from)].to_vec(), false) {
                Ok(None) => {}
                other => return other,
            }
        }
        let from = w.read_from();
        let out = w.feed_read(body[from..].to_vec(), true);
        assert_eq!(w.seen(), body.len());
        out
    }

    #[test]
    fn pieces_read_again_from_the_kept_bytes_give_the_whole_body_answer() {
        let body = br#"{"messages":[{"role":"user","content":"a \"quoted\" \u00e9 text"}],"temperature":0.25,"model":"qwen3-8b","stream":true}"#;
        let whole = Scanner::new().scan(body);
        let mut kept_some = false;
        for a in 0..=body.len() {
            for b in a..=body.len() {
                for every in [false, true] {
                    assert_eq!(
                        pieces_read(body, &[a, b], every).map(Option::unwrap),
                        whole,
                        "cuts {a} {b}"
                    );
                }
            }
            let mut w = BodyWindow::scan();
            w.parser.look_at_every_piece();
            let _ = w.feed_read(body[..a].to_vec(), false);
            kept_some |= w.retained() > 0 && w.read_from() < w.seen();
        }
        // Some cut leaves bytes to read again (else this would test nothing).
        assert!(kept_some);
    }

    /// A parser that keeps everything from `needed` on and notes each window it is given.
    struct Spy {
        needed: usize,
        windows: Vec<(*const u8, usize, usize)>,
    }

    impl Resumable for Spy {
        type Output = ();
        type Error = ();
        fn resume_window(&mut self, w: &[u8], base: usize, _: bool) -> Result<Option<()>, ()> {
            self.windows.push((w.as_ptr(), base, w.len()));
            Ok(None)
        }
        fn needed_from(&self) -> usize {
            self.needed
        }
    }

    #[test]
    fn a_piece_read_from_the_kept_bytes_is_parsed_where_it_landed() {
        let mut w = BodyWindow::new(Spy {
            needed: 3,
            windows: Vec::new(),
        });
        w.feed_read(b"abcd".to_vec(), false).unwrap();
        assert_eq!((w.read_from(), w.retained(), w.seen()), (3, 1, 4));
        // The next read starts at the kept byte; the piece is the window, not a copy of it.
        let piece = b"defgh".to_vec();
        let at = piece.as_ptr();
        w.feed_read(piece, false).unwrap();
        assert_eq!(w.parser.windows.last(), Some(&(at, 3, 5)));
        assert_eq!(w.seen(), 8);
    }

    #[test]
    fn a_long_prompt_is_not_kept_between_pieces() {
        let prompt = "x".repeat(512 * 1024);
        let body =
            format!(r#"{{"messages":[{{"role":"user","content":"{prompt}"}}],"model":"m"}}"#);
        // Pieces the size Envoy hands over (tens of KiB) are scanned and dropped at once.
        let cuts: Vec<usize> = (1..16).map(|i| i * 32 * 1024 + i).collect();
        let (got, max_kept) = pieces(body.as_bytes(), &cuts);
        assert_eq!(got.unwrap().unwrap().model, "m");
        assert!(max_kept < 64, "kept {max_kept} bytes of a prompt");
        // Small pieces wait until enough has arrived to be worth a look, and no longer.
        let cuts: Vec<usize> = (1..128).map(|i| i * 4096).collect();
        let (got, max_kept) = pieces(body.as_bytes(), &cuts);
        assert_eq!(got.unwrap().unwrap().model, "m");
        assert!(max_kept < 16 * 1024, "kept {max_kept} bytes of a prompt");
    }

    #[test]
    fn a_broken_piece_is_refused_when_it_arrives() {
        let mut w = BodyWindow::scan();
        let r = w.feed(br#"{"model": tru"#.to_vec(), false);
        assert!(
            matches!(r, Ok(None) | Err(ScanError::Invalid { .. })),
            "{r:?}"
        );
        let r = w.feed(vec![b'x'; 32 * 1024], false);
        assert!(matches!(r, Err(ScanError::Invalid { .. })), "{r:?}");
    }
}
