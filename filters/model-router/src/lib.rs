//! The model-router filter: reads `model` from the request body, matches the ModelRouter rules,
//! and stamps the decision headers the route table dispatches on.
//!
//! This layer only moves headers and bytes; `router_core` decides. Every hostcall goes through
//! `filter_edge`, which returns errors instead of panicking.

// A filter must not panic (in Envoy a trap fails every later request on the worker, closed).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod budget;
mod budget_headers;
mod budget_lease;
mod budget_remote;
mod http;
mod marks;
mod metrics;
mod pick;
mod quarantine;
mod shadow;
mod usage;
mod worker;

use filter_edge::{self as edge, Level};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use std::rc::Rc;
use worker::Worker;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

#[derive(Default)]
struct Root {
    worker: Option<Rc<Worker>>,
}

impl Context for Root {
    /// The root's calls: vLLM metrics scrapes (`pick`), shadow copies (`shadow`) and the shared
    /// ledger's settles and releases (`budget_remote`); a scrape token is claimed first.
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(worker) = &self.worker {
            if worker.pick.on_scrape(token, body_size, edge::now_nanos()) {
                return;
            }
            if let Some(shadow) = &worker.shadow {
                if shadow.answered(token, num_headers) {
                    return;
                }
            }
            if let Some(budgets) = &worker.budgets {
                budgets.ended(token, num_headers, body_size);
            }
        }
    }

    /// The VM is stopping: lease mode releases this gateway's leases first (the host waits for
    /// `proxy_done`, sent when the releases are answered).
    fn on_done(&mut self) -> bool {
        match self.worker.as_ref().and_then(|w| w.budgets.as_ref()) {
            Some(budgets) => !budgets.release_leases(),
            None => true,
        }
    }
}

impl RootContext for Root {
    /// A request rang: its shadow copies are waiting to be sent from here.
    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Some(shadow) = self.worker.as_ref().and_then(|w| w.shadow.as_ref()) {
            shadow.on_ring(queue_id);
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        match edge::configured_router() {
            Ok(router) => {
                edge::log(
                    Level::Info,
                    &format!("model-router: configured for {}", router.config.router),
                );
                let worker = match Worker::new(router) {
                    Ok(w) => w,
                    Err(e) => {
                        edge::log(Level::Error, &format!("model-router: {e}"));
                        return false;
                    }
                };
                if let Err(e) = edge::set_tick_period(edge::shared_table::REFRESH_MS) {
                    // Without ticks a quarantine still holds on the worker that set it.
                    edge::log(
                        Level::Warn,
                        &format!("model-router: no tick, quarantines stay per worker: {e}"),
                    );
                }
                self.worker = Some(Rc::new(worker));
                true
            }
            Err(e) => {
                edge::log(
                    Level::Error,
                    &format!("model-router: invalid configuration: {e}"),
                );
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(worker) = &self.worker {
            worker.quarantine.refresh();
            worker.audit_logged.set(edge::log_enabled(Level::Info));
            worker.pick.on_tick(edge::now_nanos());
            if let Some(budgets) = &worker.budgets {
                budgets.flush();
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(http::Request::new(
            self.worker.clone(),
            context_id,
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
