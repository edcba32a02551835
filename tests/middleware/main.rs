#![cfg(all(feature = "axum", feature = "actix"))]
//! The middleware: the lock over HTTP (one scenario suite for both frameworks), over gRPC
//! ([`grpc`]), and the key extractors ([`extractors`]).
//!
//! Over HTTP, one scenario suite for both frameworks: every scenario is an
//! `async fn <scenario><F: Framework>()`, written once, and [`on_both!`] runs it as
//! `axum::<scenario>` (`RedlockLayer` in an axum router) and `actix::<scenario>`
//! (`RedlockMiddleware` in an actix-web app). Real servers on loopback ports, real Redis
//! masters (each test starts its own, on free ports), a reqwest client.
//!
//! - [`harness`]: the app described once, served by either framework;
//! - the scenarios: [`exclusion`], [`waiting`], [`unavailable`], [`keys`], [`scope`],
//!   [`methods`], [`responder`], [`release`], [`keep_alive`], [`on_lost`];
//! - [`fencing`]: the lease's fencing token passed to the handler in a header;
//! - [`fenced_store`]: the token checked where the data lives (a fenced Redis write): a
//!   paused handler's late write refused, its client answered `409`;
//! - replay (idempotent endpoints): [`replay`], [`replay_faults`], [`replay_limits`];
//! - [`one_answer`]: after a lost lease, every duplicate gets the same answer;
//! - [`mixed`], [`replay_mixed`]: axum and actix-web side by side, on the same masters;
//! - [`axum_only`], [`actix_only`]: what only one framework has (the tower service in
//!   process; actix-web's half-closed connections);
//! - [`grpc`]: gRPC answers with a real tonic server and client;
//! - [`extractors`]: the key extractors through the public API (no Redis).
//!
//! No sleep synchronizes anything: handlers block on a gate the test opens once it has seen
//! what it needs, and every wait is bounded.

use tower_redlock_testkit as support;

mod actix_only;
mod axum_only;
mod exclusion;
mod extractors;
mod fenced_store;
mod fencing;
mod grpc;
mod harness;
mod keep_alive;
mod keys;
mod methods;
mod mixed;
mod on_lost;
mod one_answer;
mod release;
mod replay;
mod replay_faults;
mod replay_limits;
mod replay_mixed;
mod responder;
mod scope;
mod unavailable;
mod waiting;
mod wake;

/// `on_both! { module::scenario, ... }`: for each scenario, the test `axum::scenario` and the
/// test `actix::scenario`. Both run on a multi-thread Tokio runtime: the test drives the
/// client and the masters, and each framework's server runs on threads of its own (axum's
/// tasks on the test's runtime; actix-web's worker with an actix runtime of its own, as
/// `HttpServer` always does), so neither needs `#[actix_web::test]`. A scenario that is not
/// listed here is dead code, which the lints refuse.
///
/// A known difference is marked, never dropped: `scenario { actix: #[ignore = "why"] }` keeps
/// the actix-web test (run it with `--ignored`).
macro_rules! on_both {
    ($($module:ident :: $scenario:ident $({ actix: #[$actix:meta] })?),* $(,)?) => {
        /// Every scenario on axum 0.8, through `RedlockLayer`.
        mod axum {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    crate::$module::$scenario::<crate::harness::Axum>().await;
                }
            )*
        }

        /// Every scenario on actix-web 4, through `RedlockMiddleware`.
        mod actix {
            $(
                $(#[$actix])?
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    crate::$module::$scenario::<crate::harness::Actix>().await;
                }
            )*
        }
    };
}

on_both! {
    exclusion::one_key_across_two_instances_runs_exactly_once,
    exclusion::different_keys_run_concurrently,
    waiting::waiting_requests_take_turns,
    waiting::waiting_gives_up_at_its_deadline,
    wake::wake_a_waiting_duplicate_gets_the_replay_when_the_first_completes,
    unavailable::majority_down_fails_closed_or_runs_unlocked,
    unavailable::checked_new_refuses_a_ttl_above_restart_protection,
    unavailable::stalled_majority_is_ridden_out_not_answered_503,
    keys::bad_keys_are_rejected_before_locking,
    keys::a_route_param_that_is_not_utf8_is_malformed,
    keys::the_handler_sees_its_lease,
    scope::keys_are_scoped_by_the_principal,
    scope::keys_are_scoped_by_the_query,
    scope::the_request_view_shows_the_query_and_the_peer,
    methods::unlocked_methods_pass_through_a_held_key,
    methods::the_method_filter_is_configurable,
    methods::a_method_the_route_does_not_serve_answers_405,
    responder::a_custom_responder_adds_a_header,
    responder::explain_votes_lists_each_voter_in_409_and_503_bodies,
    release::release_on_body_end_holds_the_key_while_the_body_streams,
    release::release_on_response_frees_the_key_while_the_body_streams,
    release::cancelled_request_releases_in_the_background,
    keep_alive::keep_alive_holds_the_key_past_its_ttl,
    keep_alive::keep_alive_holds_the_key_while_a_long_body_streams,
    replay::replay_sequential_duplicates_get_the_stored_response,
    replay::replay_concurrent_duplicates_run_the_handler_once,
    replay::replay_a_reused_key_with_another_request_is_422,
    replay::replay_a_5xx_is_not_stored_and_the_retry_runs,
    replay::replay_ends_with_the_retention,
    replay::replay_is_scoped_by_the_principal,
    replay_faults::replay_survives_a_master_down_during_the_write,
    replay_faults::replay_survives_masters_losing_the_record,
    replay_faults::replay_a_cancelled_request_marks_the_key_completed,
    one_answer::lost_lease_one_answer_finish_a_later_holders_record_wins,
    one_answer::lost_lease_one_answer_abort_a_later_holders_record_wins,
    one_answer::lost_lease_one_answer_two_lost_leases_that_differ_are_unknown,
    one_answer::lost_lease_one_answer_a_later_lost_lease_cannot_change_an_answer,
    replay_limits::replay_a_response_too_large_or_streamed_is_not_stored,
    replay_limits::replay_a_body_over_the_limit_is_413,
    replay_limits::replay_the_handler_gets_the_body_unchanged,
    fencing::fencing_header_carries_the_lease_token,
    fencing::fencing_token_without_header_is_on_the_lease_handle,
    fencing::fencing_header_with_replay,
    fenced_store::fenced_store_refuses_a_paused_handlers_late_write,
    on_lost::on_lost_abort_stops_the_handler_when_the_masters_freeze,
    on_lost::on_lost_abort_stops_a_handler_past_its_validity,
    on_lost::on_lost_finish_answers_with_the_header_and_stores_nothing,
    on_lost::on_lost_abort_with_replay_answers_outcome_unknown,
    on_lost::on_lost_abort_with_replay_marks_the_key_once_the_masters_return,
    on_lost::on_lost_abort_repeatable_runs_the_key_again,
    on_lost::on_lost_finish_with_replay_stores_the_late_response,
    on_lost::on_lost_finish_with_replay_answers_while_the_masters_are_frozen,
    on_lost::on_lost_abort_breaks_off_a_streaming_body,
    on_lost::on_lost_abort_never_fires_on_healthy_masters,
}
