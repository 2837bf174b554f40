//! Who is calling: the bearer tokens of `leasehold serve --tokens FILE`, each naming a principal, and the layer that
//! refuses (401) a request to `/v1/...` without one of them (or, for a read, without a session of the operator's
//! view: [`crate::session`]). The principal it finds is the issuer the gateway records
//! on the commands of that request (`commands::post`): "who released what" is a fact of the gateway's, not a claim of
//! the body's.
//!
//! The file, one token a line:
//!
//! ```text
//! # PRINCIPAL TOKEN
//! op:alice   3q9V0cX2mB7hK1sLr8WzYt5u
//! op:ci      Zk4pQ8nR2vT6yW0aC3eG7iL1
//! ```
//!
//! A principal is an `Issuer` (printable ASCII, no spaces, quotes or backslashes, at most 128 bytes); a token is at
//! least [`MIN_TOKEN_LEN`] printable ASCII characters without spaces, and names one principal only (a principal may
//! have several tokens: a new one beside the old while clients move over). Blank lines and lines starting with `#`
//! are skipped. Tokens are kept as SHA-256 digests and compared in constant time, every one of them, on each request.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use leasehold_schemas::ids::Issuer;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::error;
use crate::session::Access;

/// The shortest token taken: 16 characters of a random alphabet are more than a network attacker can guess.
pub const MIN_TOKEN_LEN: usize = 16;

/// The bearer tokens of a gateway, as SHA-256 digests, each with its principal.
#[derive(Clone)]
pub struct Tokens {
    entries: Vec<Entry>,
}

#[derive(Clone)]
struct Entry {
    digest: [u8; 32],
    principal: Issuer,
}

impl fmt::Debug for Tokens {
    // The digests stay out of logs too: only how many tokens, and whose.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens").field("principals", &self.principals()).finish()
    }
}

/// Why a token file is refused: the line (from 1; 0 for the file as a whole) and what is wrong with it.
#[derive(Debug)]
pub struct TokenFileError {
    line: usize,
    kind: TokenFileErrorKind,
    message: String,
}

/// What kind of refusal a [`TokenFileError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenFileErrorKind {
    /// The file cannot be read (or is not UTF-8).
    Unreadable,
    /// A line is not `PRINCIPAL TOKEN`.
    Malformed,
    /// The principal is not a valid issuer.
    BadPrincipal,
    /// The token has characters a header cannot carry, or spaces.
    BadToken,
    /// The token is shorter than [`MIN_TOKEN_LEN`].
    ShortToken,
    /// The token is on an earlier line too.
    DuplicateToken,
    /// No token at all: every request would be refused.
    Empty,
}

impl TokenFileError {
    pub fn kind(&self) -> TokenFileErrorKind {
        self.kind
    }

    /// The line at fault, from 1; 0 when it is the file as a whole.
    pub fn line(&self) -> usize {
        self.line
    }

    fn at(line: usize, kind: TokenFileErrorKind, message: impl Into<String>) -> Self {
        TokenFileError { line, kind, message: message.into() }
    }
}

impl fmt::Display for TokenFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 { f.write_str(&self.message) } else { write!(f, "line {}: {}", self.line, self.message) }
    }
}

impl std::error::Error for TokenFileError {}

impl Tokens {
    /// Reads and parses the token file at `path` ([`Tokens::parse`]). Also answers a warning when the file can be
    /// read by its group or by others: the secrets in it are then as good as theirs.
    pub fn load(path: &Path) -> Result<(Tokens, Option<String>), TokenFileError> {
        let unreadable = |e: std::io::Error| {
            TokenFileError::at(0, TokenFileErrorKind::Unreadable, format!("{}: {e}", path.display()))
        };
        let metadata = std::fs::metadata(path).map_err(unreadable)?;
        let text = std::fs::read_to_string(path).map_err(unreadable)?;
        let tokens = Tokens::parse(&text)?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&metadata.permissions());
        let warning = (mode & 0o044 != 0).then(|| {
            format!(
                "{} can be read by its group or by others (mode {:o}): anyone who can read it can act as its \
                 principals; chmod 600 it",
                path.display(),
                mode & 0o777
            )
        });
        Ok((tokens, warning))
    }

    /// Parses a token file: `PRINCIPAL TOKEN` a line, `#` comments and blank lines skipped. Refuses, naming the
    /// line, a line that is not two words, a principal that is not an issuer, a token shorter than
    /// [`MIN_TOKEN_LEN`] or with characters other than printable ASCII, a token twice, and a file without tokens.
    pub fn parse(text: &str) -> Result<Tokens, TokenFileError> {
        use TokenFileErrorKind as Kind;
        let mut entries: Vec<Entry> = Vec::new();
        for (at, line) in text.lines().enumerate() {
            let n = at + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let [principal, token] = words[..] else {
                return Err(TokenFileError::at(
                    n,
                    Kind::Malformed,
                    format!(
                        "{} word(s) where `PRINCIPAL TOKEN` is expected (a token has no spaces; comments are whole \
                         lines starting with #)",
                        words.len()
                    ),
                ));
            };
            let principal = Issuer::new(principal)
                .map_err(|e| TokenFileError::at(n, Kind::BadPrincipal, format!("the principal: {e}")))?;
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(TokenFileError::at(
                    n,
                    Kind::BadToken,
                    format!("the token of {principal} has characters other than printable ASCII"),
                ));
            }
            if token.len() < MIN_TOKEN_LEN {
                return Err(TokenFileError::at(
                    n,
                    Kind::ShortToken,
                    format!(
                        "the token of {principal} has {} characters; a token has at least {MIN_TOKEN_LEN} (make one \
                         with `openssl rand -hex 32`)",
                        token.len()
                    ),
                ));
            }
            let digest = digest(token);
            if let Some(first) = entries.iter().position(|e| e.digest == digest) {
                return Err(TokenFileError::at(
                    n,
                    Kind::DuplicateToken,
                    format!(
                        "the token of {principal} is also the token of {} on an earlier line: a token names one \
                         principal",
                        entries[first].principal
                    ),
                ));
            }
            entries.push(Entry { digest, principal });
        }
        if entries.is_empty() {
            return Err(TokenFileError::at(
                0,
                Kind::Empty,
                "the token file names no token: every request would be refused; write `PRINCIPAL TOKEN` lines",
            ));
        }
        Ok(Tokens { entries })
    }

    /// The principal of `token`, if it is one of these. Every digest is compared, each in constant time: how long
    /// this takes says nothing of how close a guess came, nor of which token matched.
    pub fn principal_of(&self, token: &str) -> Option<&Issuer> {
        let presented = digest(token);
        let mut found = None;
        for entry in &self.entries {
            if constant_time_eq(&entry.digest, &presented) {
                found = Some(&entry.principal);
            }
        }
        found
    }

    /// The principals, each once, in the order of the file.
    pub fn principals(&self) -> Vec<&Issuer> {
        let mut principals: Vec<&Issuer> = Vec::new();
        for entry in &self.entries {
            if !principals.contains(&&entry.principal) {
                principals.push(&entry.principal);
            }
        }
        principals
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal, without stopping at the first byte that differs.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// The authenticated caller of a request, put in its extensions by [`authenticate`].
#[derive(Debug, Clone)]
pub(crate) struct Principal(pub(crate) Issuer);

/// The bearer token of a request's `Authorization` header: `None` without the header, `Some(None)` when it is not
/// `Bearer <token>`.
pub(crate) fn bearer_of(request: &Request) -> Option<Option<String>> {
    request.headers().get(header::AUTHORIZATION).map(|value| {
        value.to_str().ok().and_then(|text| {
            let (scheme, token) = text.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_owned())
        })
    })
}

/// Whether a request only reads: what a session of the operator's view may do.
pub(crate) fn reads(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// Lets a request to `/v1/...` through with its [`Principal`] when it carries `Authorization: Bearer <one of the
/// tokens>`, or, when it only reads (`GET`, `HEAD`), the cookie of a live session of the operator's view (the live
/// feed's `EventSource` cannot send a header); otherwise answers 401 with `WWW-Authenticate: Bearer` and the handler
/// never runs (nothing is published). A command with a session cookie and no token is refused like one with
/// nothing: a session only reads.
pub(crate) async fn authenticate(State(access): State<Arc<Access>>, mut request: Request, next: Next) -> Response {
    let presented = bearer_of(&request);
    let had_header = presented.is_some();
    let refusal = match presented {
        None => {
            if reads(request.method())
                && let Some((principal, end)) = access.session_of(request.headers(), Instant::now())
            {
                request.extensions_mut().insert(Principal(principal));
                request.extensions_mut().insert(end);
                return next.run(request).await;
            }
            if !reads(request.method()) && Access::has_session_cookie(request.headers()) {
                "a session of the operator's view only reads (GET): a command needs `Authorization: Bearer <token>`, a \
                 token of the gateway's --tokens file (the command line: LEASEHOLD_TOKEN, --token-file or \
                 --gateway-token)"
            } else {
                "this gateway needs `Authorization: Bearer <token>`, a token of its --tokens file (the command line: \
                 LEASEHOLD_TOKEN, --token-file or --gateway-token)"
            }
        }
        Some(None) => "the Authorization header is not `Bearer <token>`",
        Some(Some(token)) => match access.tokens.principal_of(&token) {
            Some(principal) => {
                request.extensions_mut().insert(Principal(principal.clone()));
                return next.run(request).await;
            }
            None => "the bearer token is not one this gateway knows: check it against the gateway's --tokens file",
        },
    };
    tracing::info!(path = request.uri().path(), "refused a request without a valid bearer token or session");
    let mut response = error(StatusCode::UNAUTHORIZED, refusal);
    let challenge =
        if had_header { r#"Bearer realm="leasehold", error="invalid_token""# } else { r#"Bearer realm="leasehold""# };
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef";

    #[track_caller]
    fn refused(text: &str, line: usize, kind: TokenFileErrorKind, says: &[&str]) {
        let e = Tokens::parse(text).expect_err(text);
        assert_eq!((e.line(), e.kind()), (line, kind), "{e}");
        let message = e.to_string();
        if line > 0 {
            assert!(message.starts_with(&format!("line {line}: ")), "{message}");
        }
        for needle in says {
            assert!(message.contains(needle), "{message:?} does not say {needle:?}");
        }
    }

    #[test]
    fn a_file_of_principals_and_tokens_is_read_and_its_tokens_found() {
        let text = "# who  token\n\nop:alice 0123456789abcdef\n   # indented comment\nop:ci\tZk4pQ8nR2vT6yW0aC3eG7iL1\n\
                    op:alice fedcba9876543210-second\n";
        let tokens = Tokens::parse(text).expect("a good file");
        let names: Vec<&str> = tokens.principals().iter().map(|p| p.as_str()).collect();
        assert_eq!(names, ["op:alice", "op:ci"]);
        assert_eq!(tokens.principal_of(GOOD).map(Issuer::as_str), Some("op:alice"));
        assert_eq!(tokens.principal_of("fedcba9876543210-second").map(Issuer::as_str), Some("op:alice"));
        assert_eq!(tokens.principal_of("Zk4pQ8nR2vT6yW0aC3eG7iL1").map(Issuer::as_str), Some("op:ci"));
        assert_eq!(tokens.principal_of("0123456789abcdeF"), None);
        assert_eq!(tokens.principal_of("0123456789abcdef0"), None);
        assert_eq!(tokens.principal_of(""), None);
        assert!(!format!("{tokens:?}").contains("0123"), "no secret in Debug: {tokens:?}");
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_line() {
        use TokenFileErrorKind as Kind;
        refused("# nothing\n\n", 0, Kind::Empty, &["no token"]);
        refused("", 0, Kind::Empty, &["no token"]);
        refused("op:alice\n", 1, Kind::Malformed, &["1 word(s)", "PRINCIPAL TOKEN"]);
        refused("# a\nop:alice 0123456789abcdef extra\n", 2, Kind::Malformed, &["3 word(s)"]);
        refused("op:alice 0123456789abcdef # a comment\n", 1, Kind::Malformed, &["whole lines"]);
        refused("op:alice 0123456789abcde\n", 1, Kind::ShortToken, &["op:alice", "15 characters", "at least 16"]);
        refused("op:a 0123456789abcdef\nop:b 0123456789abcdef\n", 2, Kind::DuplicateToken, &["op:b", "op:a"]);
        refused("op:a 0123456789abcdef\nop:a 0123456789abcdef\n", 2, Kind::DuplicateToken, &["earlier line"]);
        refused("op\"alice 0123456789abcdef\n", 1, Kind::BadPrincipal, &["the principal"]);
        let long = "p".repeat(129);
        refused(&format!("{long} 0123456789abcdef\n"), 1, Kind::BadPrincipal, &["the principal"]);
        refused("op:alice 0123456789abcdefé\n", 1, Kind::BadToken, &["printable ASCII"]);
    }

    #[test]
    fn a_file_readable_by_others_is_taken_with_a_warning() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tokens");
        std::fs::write(&path, "op:alice 0123456789abcdef\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let (_, warning) = Tokens::load(&path).expect("a good file");
        assert_eq!(warning, None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let (_, warning) = Tokens::load(&path).expect("a good file");
        let warning = warning.expect("a warning");
        assert!(warning.contains("644") && warning.contains("chmod 600"), "{warning}");
        let missing = Tokens::load(&dir.path().join("none")).expect_err("no file");
        assert_eq!(missing.kind(), TokenFileErrorKind::Unreadable);
    }

    #[test]
    fn equal_digests_and_only_they_compare_equal() {
        let a = digest(GOOD);
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        for at in [0, 17, 31] {
            b = a;
            b[at] ^= 1;
            assert!(!constant_time_eq(&a, &b), "a difference at byte {at}");
        }
    }
}
