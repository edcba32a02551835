//! Durable replay: the idempotency key written **inside the handler's own database
//! transaction**, so that a crash, a Redis restart or a flush cannot make a completed
//! request run again. Turned on with [`Replay::durable`](crate::replay::Replay::durable);
//! the replay guide's section "Durable replay with your database" (`tower_redlock::guide::replay`)
//! says what the row guarantees and assumes, and names the tests.
//!
//! The Redis lock keeps concurrent duplicates out and replays in milliseconds; the row is
//! the truth behind it:
//!
//! 1. After the lock, and when no Redis voter has a record of the key, the middleware looks
//!    the key's row up ([`RowStore::find`]). A row with a response is replayed (and the
//!    Redis record restored); a row without one (a crash between the commit and the store)
//!    is answered `409` completed-not-stored, or rebuilt from the business data by a hook of
//!    yours ([`Durable::rebuild`]). Either way the handler does not run.
//! 2. Otherwise the handler gets a [`KeyRow`] (an axum or actix-web extractor) and records it
//!    as the first statement of the transaction that does the work (`row.insert_in(&mut tx)`,
//!    feature `sqlx-0_8`; `row.postgres().insert_in(&tx)`, feature `tokio-postgres`). The row
//!    commits with the work or not at all.
//! 3. After the handler, the middleware stores the response in that row, in a short
//!    transaction of its own ([`RowStore::store`]), then on the Redis voters. A response
//!    below 500 from a handler that rolled back (a `402`, say) or recorded no row gets a row
//!    of its own there — never another execution's row.
//!
//! The schema is [`Table::migration`] (also `src/durable/schema.sql`); apply it with your
//! migration tool. The retention sweep is one call (`SqlxStore::sweep`, `PgStore::sweep`).
//!
//! ```no_run
//! # #[cfg(all(feature = "axum", feature = "sqlx-0_8"))]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{extract::State, http::StatusCode, routing::post, Router};
//! use sqlx::PgPool;
//! use tower_redlock::durable::{sqlx_0_8::SqlxStore, Durable, KeyRow, RowError};
//! use tower_redlock::policy::LockPolicy;
//! use tower_redlock::replay::Replay;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! async fn pay(State(db): State<PgPool>, row: KeyRow, body: String) -> Result<String, RowError> {
//!     let mut tx = db.begin().await.map_err(|e| row.check(e))?;
//!     row.insert_in(&mut tx).await?; // the first statement
//!     let id: i64 = sqlx::query_scalar("INSERT INTO payments (body) VALUES ($1) RETURNING id")
//!         .bind(body)
//!         .fetch_one(&mut *tx)
//!         .await
//!         .map_err(|e| row.check(e))?;
//!     row.commit(tx).await?;
//!     Ok(format!("payment {id}"))
//! }
//!
//! let db = PgPool::connect("postgres://app@127.0.0.1/app").await?;
//! let redlock = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
//! let replay = Replay::new().durable(Durable::new(SqlxStore::new(db.clone())));
//! let policy = LockPolicy::idempotent(redlock).replay(replay).build()?;
//! let app: Router = Router::new()
//!     .route("/payments", post(pay))
//!     .layer(RedlockLayer::new(policy))
//!     .with_state(db);
//! # let _ = app; Ok(()) }
//! ```

// The middleware reads the rows (tower or actix-web) and an adapter writes them (sqlx):
// without both, part of the core has no caller.
#![cfg_attr(
    not(all(
        any(feature = "tower", feature = "actix"),
        any(feature = "sqlx-0_8", feature = "tokio-postgres")
    )),
    allow(dead_code, unused_imports)
)]

#[cfg(feature = "actix")]
mod actix;
#[cfg(feature = "axum")]
mod axum;
mod row;
#[cfg(feature = "sqlx-0_8")]
pub mod sqlx_0_8;
mod statements;
mod store;
mod table;
#[cfg(feature = "tokio-postgres")]
pub mod tokio_postgres;

pub(crate) use row::{millis, RowKey, RowState};
pub use row::{KeyRow, RowError, RowErrorKind};
pub use statements::RowStatements;
pub use store::{Durable, FoundRow, NewRecord, RebuildFuture, Rebuilt, RowFuture, RowStore};
pub use table::Table;
