//! The SQL of the keys' table, for any driver: the schema and the four statements.

use std::fmt;
use std::sync::Arc;

/// The migration for the default table name, as shipped in `src/durable/schema.sql`.
const SCHEMA: &str = include_str!("schema.sql");
/// The default table name.
const DEFAULT_NAME: &str = "tower_redlock_keys";
/// The longest table name PostgreSQL keeps (`NAMEDATALEN - 1`), per part.
const MAX_IDENT: usize = 63;

/// The keys' table: its name, its schema ([`migration`](Self::migration)) and the SQL each
/// step runs. An adapter runs these statements with its driver and binds the parameters
/// each one's documentation lists, in order.
///
/// ```
/// use tower_redlock::durable::Table;
///
/// let table = Table::default();
/// assert_eq!(table.name(), "tower_redlock_keys");
/// assert!(table.migration().starts_with("-- tower-redlock"));
///
/// let other = Table::new("billing.idempotency_keys").unwrap();
/// assert!(other.migration().contains("CREATE TABLE IF NOT EXISTS billing.idempotency_keys"));
/// assert!(Table::new("keys; DROP TABLE users").is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Table {
    name: Arc<str>,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            name: DEFAULT_NAME.into(),
        }
    }
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Table").field(&self.name).finish()
    }
}

impl Table {
    /// The table `name`: an identifier, or `schema.identifier` (letters, digits and `_`,
    /// not starting with a digit, at most 63 bytes each; unquoted, so folded to lower case
    /// by PostgreSQL).
    ///
    /// # Errors
    ///
    /// An invalid-input [`Error`](crate::Error) for any other name: the name is written
    /// into the SQL, so nothing else is accepted.
    pub fn new(name: &str) -> crate::Result<Self> {
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= MAX_IDENT
                && !p.as_bytes()[0].is_ascii_digit()
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| part_ok(p)) {
            return Err(crate::Error::invalid(format!(
                "{name:?} is not a table name: use an identifier or schema.identifier \
                 (letters, digits and _, not starting with a digit, at most 63 bytes each)"
            )));
        }
        Ok(Self { name: name.into() })
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's schema: a `CREATE TABLE IF NOT EXISTS` and its expiry index, to apply
    /// with your migration tool.
    pub fn migration(&self) -> String {
        // An index takes no schema name: it is made in its table's schema.
        let bare = self.name.rsplit('.').next().unwrap_or(&self.name);
        SCHEMA
            .replace("tower_redlock_keys_expires_at", "\u{0}index")
            .replace(DEFAULT_NAME, &self.name)
            .replace("\u{0}index", &format!("{bare}_expires_at"))
    }

    /// The handler's statement, the first of its transaction: inserts the key's row, or
    /// finds it taken. Parameters: `$1` the key hash (`bytea`, 32 bytes), `$2` the
    /// fingerprint (`bytea`), `$3` the retention in milliseconds (`int8`), `$4` the
    /// transaction's `lock_timeout` (`text`, e.g. `'5000ms'`; set for the rest of the
    /// transaction), `$5` the execution's run id (`bytea`, 16 bytes). One row affected:
    /// recorded. None: the key's row has committed before (an expired one is taken over).
    /// It waits, up to the `lock_timeout`, for another transaction that inserted the same key.
    pub fn insert_sql(&self) -> String {
        format!(
            "WITH timeout AS (SELECT set_config('lock_timeout', $4, true)) \
             INSERT INTO {t} AS t (key_hash, fingerprint, run_id, expires_at) \
             SELECT $1, $2, $5, now() + $3::int8 * interval '1 millisecond' FROM timeout \
             ON CONFLICT (key_hash) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
             record = NULL, run_id = EXCLUDED.run_id, created_at = now(), \
             expires_at = EXCLUDED.expires_at WHERE t.expires_at <= now()",
            t = self.name
        )
    }

    /// The middleware's lookup: the row of a key, if one committed and has not expired.
    /// Parameter: `$1` the key hash. Columns: `fingerprint` (`bytea`), `record` (`bytea`,
    /// `NULL` until the response is stored), `run_id` (`bytea`), `age_ms` (`int8`, since the
    /// row's transaction began), `left_ms` (`int8`, until it expires). It never waits on an
    /// uncommitted row.
    pub fn find_sql(&self) -> String {
        format!(
            "SELECT fingerprint, record, run_id, \
             (extract(epoch FROM now() - created_at) * 1000)::int8 AS age_ms, \
             (extract(epoch FROM expires_at - now()) * 1000)::int8 AS left_ms \
             FROM {t} WHERE key_hash = $1 AND expires_at > now()",
            t = self.name
        )
    }

    /// The middleware's store, in a transaction of its own after the handler's: the
    /// response's record goes into the row the execution `$6` wrote (committed without a
    /// response; waited for while its transaction is open), or, when that execution's row
    /// did not commit, into a row of its own — never over another execution's row (an
    /// expired one is taken over). The row is kept for the retention from now. Parameters:
    /// `$1` the key hash, `$2` the fingerprint, `$3` the record (`bytea`), `$4` the
    /// retention in milliseconds, `$5` the `lock_timeout`, `$6` the run id. One row
    /// affected: stored. None: another execution's row is there, or the record already.
    pub fn store_sql(&self) -> String {
        format!(
            "WITH timeout AS (SELECT set_config('lock_timeout', $5, true)) \
             INSERT INTO {t} AS t (key_hash, fingerprint, record, run_id, expires_at) \
             SELECT $1, $2, $3, $6, now() + $4::int8 * interval '1 millisecond' FROM timeout \
             ON CONFLICT (key_hash) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
             record = EXCLUDED.record, run_id = EXCLUDED.run_id, \
             created_at = CASE WHEN t.expires_at <= now() THEN now() ELSE t.created_at END, \
             expires_at = greatest(t.expires_at, EXCLUDED.expires_at) \
             WHERE t.expires_at <= now() OR (t.run_id = EXCLUDED.run_id AND t.record IS NULL)",
            t = self.name
        )
    }

    /// The handler's check before its commit: the row is still there, its transaction
    /// healthy (a statement in an aborted transaction fails), and its `created_at` is now —
    /// a lookup then counts the row's age from its commit. Parameters: `$1` the key hash,
    /// `$2` the run id. One row affected: commit.
    pub fn commit_check_sql(&self) -> String {
        format!(
            "UPDATE {t} SET created_at = clock_timestamp() WHERE key_hash = $1 AND run_id = $2",
            t = self.name
        )
    }

    /// One batch of the retention sweep: deletes up to `$1` (`int8`) expired rows, oldest
    /// first, skipping rows another transaction holds. Repeat while it deletes a full batch.
    pub fn sweep_sql(&self) -> String {
        format!(
            "DELETE FROM {t} WHERE key_hash IN (SELECT key_hash FROM {t} \
             WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
            t = self.name
        )
    }
}
