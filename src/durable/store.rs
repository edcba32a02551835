//! The middleware's side: [`RowStore`], the two statements it runs around the handler, and
//! [`Durable`], the replay setting that turns the row on.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{RowError, Table};

/// A boxed future of a [`RowStore`] statement.
pub type RowFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, RowError>> + Send + 'a>>;

/// A committed key row, as the middleware's lookup found it.
#[derive(Clone, PartialEq, Eq)]
pub struct FoundRow {
    /// The fingerprint of the request that committed it.
    pub fingerprint: Bytes,
    /// Its stored response (the replay record), `None` until it is stored.
    pub record: Option<Bytes>,
    /// The id of the execution that wrote it.
    pub run_id: Bytes,
    /// Since its transaction began.
    pub age: Duration,
    /// Until it expires.
    pub left: Duration,
}

impl fmt::Debug for FoundRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FoundRow")
            .field("record_len", &self.record.as_ref().map(Bytes::len))
            .field("age", &self.age)
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl FoundRow {
    /// A row from the lookup's columns ([`Table::find_sql`]), for adapters.
    pub(crate) fn from_columns(
        fingerprint: Vec<u8>,
        record: Option<Vec<u8>>,
        run_id: Vec<u8>,
        age_ms: i64,
        left_ms: i64,
    ) -> Self {
        let ms = |ms: i64| Duration::from_millis(ms.max(0).unsigned_abs());
        Self {
            fingerprint: fingerprint.into(),
            record: record.map(Into::into),
            run_id: run_id.into(),
            age: ms(age_ms),
            left: ms(left_ms),
        }
    }
}

/// A response to store in a key's row ([`Table::store_sql`]'s parameters).
#[derive(Debug, Clone, Copy)]
pub struct NewRecord<'a> {
    /// The key hash (32 bytes).
    pub key_hash: &'a [u8],
    /// The request's fingerprint.
    pub fingerprint: &'a [u8],
    /// The replay record.
    pub record: &'a [u8],
    /// How long the row is kept, in milliseconds.
    pub retention_ms: i64,
    /// The statement's `lock_timeout` (`"<ms>ms"`).
    pub lock_timeout: &'a str,
    /// The execution whose row it goes into (or whose own row it makes).
    pub run_id: &'a [u8],
}

/// Where the middleware reads and completes key rows: an adapter runs the [`Table`]'s
/// statements with its driver. The crate's are `sqlx_0_8::SqlxStore` (feature `sqlx-0_8`)
/// and `tokio_postgres::PgStore` (feature `tokio-postgres`); another driver implements these
/// two methods with [`Table::find_sql`] and [`Table::store_sql`] (and the handler's side with
/// [`KeyRow::statements`](super::KeyRow::statements)).
pub trait RowStore: Send + Sync + 'static {
    /// The table.
    fn table(&self) -> &Table;

    /// [`Table::find_sql`]: the key's row, if one committed and has not expired.
    fn find<'a>(&'a self, key_hash: &'a [u8]) -> RowFuture<'a, Option<FoundRow>>;

    /// [`Table::store_sql`], in a transaction of its own: `true` when it stored the record
    /// (its `stored` column is 1).
    fn store<'a>(&'a self, record: NewRecord<'a>) -> RowFuture<'a, bool>;
}

/// A response rebuilt from the business data by [`Durable::rebuild`]'s hook, for a key whose
/// row committed without its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    /// The status.
    pub status: u16,
    /// The headers (those replay never stores are left out, as from a handler).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

impl Rebuilt {
    /// A response with `status` and `body`, no headers.
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// With the header `name: value`.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .push((name.into().to_ascii_lowercase(), value.into()));
        self
    }
}

/// The future of [`Durable::rebuild`]'s hook.
pub type RebuildFuture = Pin<Box<dyn Future<Output = Option<Rebuilt>> + Send>>;

type RebuildHook = Arc<dyn Fn(String) -> RebuildFuture + Send + Sync>;

/// Durable replay: a [`Replay`](crate::replay::Replay) setting
/// ([`Replay::durable`](crate::replay::Replay::durable)) that keeps every completed key in a
/// row of the handler's own database as well as on the Redis voters. See the
/// [module](crate::durable).
#[derive(Clone)]
#[must_use = "durable settings do nothing until given to a Replay"]
pub struct Durable {
    pub(crate) store: Arc<dyn RowStore>,
    pub(crate) row_sql: Arc<super::row::RowSql>,
    pub(crate) lock_timeout: Duration,
    pub(crate) timeout: Duration,
    pub(crate) rebuild: Option<RebuildHook>,
}

impl fmt::Debug for Durable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Durable")
            .field("table", self.store.table())
            .field("lock_timeout", &self.lock_timeout)
            .field("timeout", &self.timeout)
            .field("rebuild", &self.rebuild.is_some())
            .finish_non_exhaustive()
    }
}

impl Durable {
    /// The default [`lock_timeout`](Self::lock_timeout): 5 s.
    pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default [`timeout`](Self::timeout): 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// Rows kept by `store`.
    pub fn new(store: impl RowStore) -> Self {
        let row_sql = Arc::new(super::row::RowSql::of(store.table()));
        Self {
            store: Arc::new(store),
            row_sql,
            lock_timeout: Self::DEFAULT_LOCK_TIMEOUT,
            timeout: Self::DEFAULT_TIMEOUT,
            rebuild: None,
        }
    }

    /// Rebuilds the response of a key whose row committed without one (its replica died
    /// between the commit and the store) from the business data: `hook` gets the key's hash
    /// in hex ([`KeyRow::key_hash`](super::KeyRow::key_hash), kept beside that data by the
    /// handler) and returns the response, or `None` to answer `409` completed-not-stored.
    /// A rebuilt response is stored in the row and on the voters, and replayed; the handler
    /// never runs again. The hook is bounded by [`timeout`](Self::timeout).
    pub fn rebuild<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<Rebuilt>> + Send + 'static,
    {
        self.rebuild = Some(Arc::new(move |key| Box::pin(hook(key))));
        self
    }

    /// The `lock_timeout` of the handler's transaction, set by its insert (and of the
    /// middleware's store): the longest a duplicate waits on another transaction's row
    /// before it is answered `409` + `Retry-After`.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The longest the middleware waits for its lookup or its store. A lookup that does not
    /// answer in time is answered `503` (nothing ran); a store, logged (the response is
    /// still kept on the Redis voters).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub(crate) fn check(&self) -> crate::Result<()> {
        // PostgreSQL's `lock_timeout` is an int4 of milliseconds.
        let max = Duration::from_millis(i32::MAX.unsigned_abs().into());
        for (what, d) in [
            ("lock_timeout", self.lock_timeout),
            ("timeout", self.timeout),
        ] {
            if d < Duration::from_millis(1) || d > max {
                return Err(crate::Error::invalid(format!(
                    "the durable replay's {what} must be between 1 ms and {max:?}"
                )));
            }
        }
        Ok(())
    }
}
