//! The operator's view's sessions: with tokens, a browser trades a token for a session at `POST /ui/login` and then
//! carries a cookie instead of the token. A browser cannot send `Authorization: Bearer` on a link it follows or on the
//! live feed's `EventSource`, and keeping the token itself in the browser (in script-readable storage, or in a URL)
//! would expose it; a session id is random, lives in an `HttpOnly` cookie, expires, and can be ended.
//!
//! A session only reads: it is accepted on `GET` and `HEAD` (the pages and the `/v1` reads), never on a command, so a
//! page that a browser is tricked into posting from cannot act, and a stolen cookie cannot release anything.
//!
//! Sessions are kept in this process's memory, each under the SHA-256 digest of its id (the ids themselves are not
//! kept: a memory dump or a log of the map shows no cookie that works), with its principal and its expiry. A restart
//! ends them all, which only asks the operators to log in again. Their number is bounded: a login beyond
//! [`Sessions`]'s bound ends the oldest session.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use leasehold_schemas::ids::Issuer;
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;

/// The name of the session cookie.
pub(crate) const COOKIE: &str = "leasehold_session";

/// The longest session: browsers keep a cookie at most 400 days (RFC 6265bis), so a longer `Max-Age` would only
/// promise what the browser does not keep.
pub const MAX_SESSION_TTL: Duration = Duration::from_secs(400 * 86_400);

/// The random bytes of a session id: 256 bits, more than anyone can guess.
const ID_BYTES: usize = 32;

/// What the gateway checks callers against when it has tokens: the tokens (for the API, and for a login), the
/// sessions of the operator's view, and how a session's cookie is written.
pub(crate) struct Access {
    pub(crate) tokens: Arc<Tokens>,
    pub(crate) sessions: Sessions,
    /// Whether the cookie is `Secure` (the gateway is reached over TLS, through something in front of it).
    secure: bool,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access").field("tokens", &self.tokens).field("secure", &self.secure).finish_non_exhaustive()
    }
}

impl Access {
    pub(crate) fn new(tokens: Arc<Tokens>, sessions: Sessions, secure: bool) -> Self {
        Access { tokens, sessions, secure }
    }

    /// The principal of the first live session among the request's session cookies, if any (a browser may send
    /// the cookie twice, an old one beside a new one).
    pub(crate) fn session_principal(&self, headers: &HeaderMap, now: Instant) -> Option<Issuer> {
        self.session_of(headers, now).map(|(principal, _)| principal)
    }

    /// The principal of the first live session among the request's session cookies, with when that session ends:
    /// what a stream opened under it (the live feed) stops at.
    pub(crate) fn session_of(&self, headers: &HeaderMap, now: Instant) -> Option<(Issuer, SessionEnd)> {
        session_ids(headers).find_map(|id| self.sessions.lookup(id, now))
    }

    /// Whether the request carries a session cookie at all (live or not): a refusal can then say that a session
    /// does not send commands.
    pub(crate) fn has_session_cookie(headers: &HeaderMap) -> bool {
        session_ids(headers).next().is_some()
    }

    /// The `Set-Cookie` of a new session `id`: sent back on every request to this origin (`Path=/`, so the live
    /// feed's `/v1/events` gets it too), never readable by a script (`HttpOnly`), never sent by a request another
    /// site starts (`SameSite=Strict`), kept as long as the session lasts (`Max-Age`), and only over TLS when the
    /// gateway is behind it (`Secure`).
    pub(crate) fn cookie(&self, id: &SessionId) -> HeaderValue {
        let text = format!(
            "{COOKIE}={}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
            id.0,
            self.sessions.ttl.as_secs(),
            if self.secure { "; Secure" } else { "" }
        );
        HeaderValue::try_from(text).expect("a session cookie is ASCII: hex digits and fixed words")
    }

    /// The `Set-Cookie` that makes a browser forget the session cookie (logout).
    pub(crate) fn cleared_cookie(&self) -> HeaderValue {
        let text = format!(
            "{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{}",
            if self.secure { "; Secure" } else { "" }
        );
        HeaderValue::try_from(text).expect("ASCII")
    }

    /// Ends every session the request's cookies name (logout).
    pub(crate) fn end_sessions_of(&self, headers: &HeaderMap) {
        for id in session_ids(headers) {
            self.sessions.end(id);
        }
    }
}

/// The values of the session cookie among the request's `Cookie` headers.
fn session_ids(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name.trim() == COOKIE).then(|| value.trim().trim_matches('"'))
        })
}

/// A new session's id: 32 bytes of the operating system's random source, in hex. It goes to the browser once, in
/// the cookie; the gateway keeps only its digest.
pub(crate) struct SessionId(String);

impl fmt::Debug for SessionId {
    // The id is a credential: it stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionId(..)")
    }
}

impl SessionId {
    fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; ID_BYTES];
        getrandom::fill(&mut bytes)?;
        Ok(SessionId(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }
}

/// The live sessions, bounded in number, each with its principal and expiry. Times are tokio's, so that a test with
/// paused time can let a session expire without waiting.
pub(crate) struct Sessions {
    ttl: Duration,
    max: usize,
    store: Mutex<Store>,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sessions").field("ttl", &self.ttl).field("max", &self.max).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Store {
    /// Each session under the digest of its id.
    by_digest: HashMap<[u8; 32], Session>,
    /// The digests in the order the sessions began: the oldest first, which is also the first to expire (every
    /// session lasts the same time), so purging and dropping the oldest both take from the front.
    by_age: BTreeMap<u64, [u8; 32]>,
    /// The serial of the next session.
    next: u64,
}

struct Session {
    principal: Issuer,
    expires: Instant,
    serial: u64,
    /// Cancelled when the session ends before its expiry (logout, or dropped for the bound).
    ended: CancellationToken,
}

/// When a session ends: at its expiry, or earlier when it is ended (logout, or the oldest dropped for the bound).
/// A stream of events opened under a session carries it, and stops there: logging out stops an open live feed too.
#[derive(Debug, Clone)]
pub(crate) struct SessionEnd {
    pub(crate) expires: Instant,
    pub(crate) ended: CancellationToken,
}

impl SessionEnd {
    /// Resolves when the session is over.
    pub(crate) async fn over(&self) {
        tokio::select! {
            () = self.ended.cancelled() => {}
            () = tokio::time::sleep_until(self.expires) => {}
        }
    }
}

impl Sessions {
    /// Sessions that last `ttl` from their login (at most [`MAX_SESSION_TTL`]), at most `max` of them at once (at
    /// least one).
    pub(crate) fn new(ttl: Duration, max: usize) -> Self {
        Sessions { ttl: ttl.min(MAX_SESSION_TTL), max: max.max(1), store: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins a session of `principal` at `now`: its id, for the cookie. The expired sessions go first; then, if
    /// the bound is reached, the oldest. Fails only when the operating system gives no random bytes.
    pub(crate) fn begin(&self, principal: Issuer, now: Instant) -> Result<SessionId, getrandom::Error> {
        let id = SessionId::random()?;
        let digest = digest(&id.0);
        let mut store = self.lock();
        store.purge(now);
        while store.by_digest.len() >= self.max {
            let Some((_, oldest)) = store.by_age.pop_first() else { break };
            if let Some(dropped) = store.by_digest.remove(&oldest) {
                dropped.ended.cancel();
            }
        }
        let serial = store.next;
        store.next += 1;
        store.by_age.insert(serial, digest);
        let ended = CancellationToken::new();
        store.by_digest.insert(digest, Session { principal, expires: now + self.ttl, serial, ended });
        Ok(id)
    }

    /// The principal of the session `id`, if it is live at `now`. An expired one is refused and forgotten (with
    /// every other that expired).
    #[cfg(test)]
    pub(crate) fn principal(&self, id: &str, now: Instant) -> Option<Issuer> {
        self.lookup(id, now).map(|(principal, _)| principal)
    }

    /// The principal of the session `id`, if it is live at `now`, and when it ends.
    fn lookup(&self, id: &str, now: Instant) -> Option<(Issuer, SessionEnd)> {
        let digest = digest(id);
        let mut store = self.lock();
        store.purge(now);
        store.by_digest.get(&digest).map(|session| {
            (session.principal.clone(), SessionEnd { expires: session.expires, ended: session.ended.clone() })
        })
    }

    /// Ends the session `id` (logout); answers whether it was live.
    pub(crate) fn end(&self, id: &str) -> bool {
        let mut store = self.lock();
        match store.by_digest.remove(&digest(id)) {
            Some(session) => {
                store.by_age.remove(&session.serial);
                session.ended.cancel();
                true
            }
            None => false,
        }
    }

    /// How many sessions are kept (expired ones not yet purged included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().by_digest.len()
    }

    /// How long a session lasts.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl Store {
    /// Forgets every session expired at `now`: they are the oldest, at the front.
    fn purge(&mut self, now: Instant) {
        while let Some((&serial, digest)) = self.by_age.first_key_value() {
            let expired = self.by_digest.get(digest).is_none_or(|session| session.expires <= now);
            if !expired {
                break;
            }
            let digest = *digest;
            self.by_age.remove(&serial);
            if let Some(expired) = self.by_digest.remove(&digest) {
                expired.ended.cancel();
            }
        }
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(name: &str) -> Issuer {
        Issuer::new(name).expect("an issuer")
    }

    #[test]
    fn a_session_is_live_until_its_expiry_and_then_forgotten() {
        let sessions = Sessions::new(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        let id = sessions.begin(issuer("op:alice"), t0).expect("random bytes");
        assert_eq!(id.0.len(), 64);
        assert!(id.0.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(sessions.principal(&id.0, t0).as_ref().map(Issuer::as_str), Some("op:alice"));
        let just_before = t0 + Duration::from_secs(60) - Duration::from_millis(1);
        assert_eq!(sessions.principal(&id.0, just_before).as_ref().map(Issuer::as_str), Some("op:alice"));
        assert_eq!(sessions.principal(&id.0, t0 + Duration::from_secs(60)), None, "expired at its expiry");
        assert_eq!(sessions.len(), 0, "and purged");
        assert_eq!(sessions.principal("not-a-session", t0), None);
    }

    #[test]
    fn a_session_of_no_time_is_never_live() {
        let sessions = Sessions::new(Duration::ZERO, 10);
        let t0 = Instant::now();
        let id = sessions.begin(issuer("op:alice"), t0).expect("random bytes");
        assert_eq!(sessions.principal(&id.0, t0), None);
    }

    #[test]
    fn expired_sessions_are_purged_when_others_begin() {
        let sessions = Sessions::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        for _ in 0..5 {
            sessions.begin(issuer("op:alice"), t0).expect("random bytes");
        }
        let later = sessions.begin(issuer("op:ci"), t0 + Duration::from_secs(5)).expect("random bytes");
        assert_eq!(sessions.len(), 6);
        sessions.begin(issuer("op:ci"), t0 + Duration::from_secs(10)).expect("random bytes");
        assert_eq!(sessions.len(), 2, "the five of t0 expired and went");
        assert!(sessions.principal(&later.0, t0 + Duration::from_secs(14)).is_some());
    }

    #[test]
    fn past_the_bound_the_oldest_session_ends() {
        let sessions = Sessions::new(Duration::from_secs(3600), 3);
        let t0 = Instant::now();
        let ids: Vec<SessionId> = (0..3u64)
            .map(|n| sessions.begin(issuer("op:alice"), t0 + Duration::from_secs(n)).expect("random bytes"))
            .collect();
        let fourth = sessions.begin(issuer("op:ci"), t0 + Duration::from_secs(3)).expect("random bytes");
        assert_eq!(sessions.len(), 3);
        let now = t0 + Duration::from_secs(4);
        assert_eq!(sessions.principal(&ids[0].0, now), None, "the oldest went");
        assert!(sessions.principal(&ids[1].0, now).is_some());
        assert!(sessions.principal(&ids[2].0, now).is_some());
        assert_eq!(sessions.principal(&fourth.0, now).as_ref().map(Issuer::as_str), Some("op:ci"));
    }

    #[test]
    fn an_ended_session_is_refused_and_the_others_stay() {
        let sessions = Sessions::new(Duration::from_secs(3600), 10);
        let t0 = Instant::now();
        let a = sessions.begin(issuer("op:alice"), t0).expect("random bytes");
        let b = sessions.begin(issuer("op:alice"), t0).expect("random bytes");
        assert_ne!(a.0, b.0, "each login gets its own id");
        assert!(sessions.end(&a.0));
        assert!(!sessions.end(&a.0), "ended once");
        assert_eq!(sessions.principal(&a.0, t0), None);
        assert!(sessions.principal(&b.0, t0).is_some());
        assert_eq!(sessions.len(), 1);
        assert!(!format!("{a:?}").contains(&a.0[..8]), "no id in Debug");
    }

    #[test]
    fn cookies_carry_their_flags_and_are_found_among_others() {
        let tokens = Arc::new(Tokens::parse("op:alice 0123456789abcdef\n").expect("tokens"));
        let plain = Access::new(tokens.clone(), Sessions::new(Duration::from_secs(7200), 10), false);
        let id = plain.sessions.begin(issuer("op:alice"), Instant::now()).expect("random bytes");
        let cookie = plain.cookie(&id);
        let text = cookie.to_str().expect("ASCII");
        assert_eq!(text, format!("leasehold_session={}; Path=/; Max-Age=7200; HttpOnly; SameSite=Strict", id.0));
        let secure = Access::new(tokens, Sessions::new(Duration::from_secs(60), 10), true);
        assert!(secure.cookie(&id).to_str().expect("ASCII").ends_with("; SameSite=Strict; Secure"));
        assert!(secure.cleared_cookie().to_str().expect("ASCII").starts_with("leasehold_session=; Path=/; Max-Age=0;"));

        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("theme=dark; leasehold_session=stale"));
        headers
            .append(header::COOKIE, HeaderValue::try_from(format!("other=1;leasehold_session={}", id.0)).expect("ok"));
        assert!(Access::has_session_cookie(&headers));
        assert_eq!(plain.session_principal(&headers, Instant::now()).as_ref().map(Issuer::as_str), Some("op:alice"));
        plain.end_sessions_of(&headers);
        assert_eq!(plain.session_principal(&headers, Instant::now()), None);
        assert!(!Access::has_session_cookie(&HeaderMap::new()));
    }
}
