//! `llmkube-budgets --listen HOST:PORT --redis redis://HOST:PORT[/DB]`, or
//! `llmkube-budgets status --service HOST:PORT --router NAMESPACE/NAME [--json]`.

use llmkube_budgets::status::{self, StatusFlags};
use llmkube_budgets::store::{RedisStore, StoreOptions};
use llmkube_budgets::{serve, server::Service, Flags};
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("status") {
        return status_command();
    }
    let flags = match Flags::parse(std::env::args().skip(1)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("llmkube-budgets: {e}");
            return ExitCode::from(2);
        }
    };
    let built = if flags.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(flags.threads)
            .enable_all()
            .build()
    };
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("llmkube-budgets: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(run(flags))
}

fn status_command() -> ExitCode {
    let flags = match StatusFlags::parse(std::env::args().skip(2)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("llmkube-budgets status: {e}");
            return ExitCode::from(2);
        }
    };
    match status::run(&flags) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("llmkube-budgets status: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: Flags) -> ExitCode {
    let store = match RedisStore::new(
        &flags.redis,
        &StoreOptions {
            hold: !flags.check_only,
            cluster: flags.cluster,
            timeout: std::time::Duration::from_millis(flags.timeout_ms),
        },
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("llmkube-budgets: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&flags.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("llmkube-budgets: --listen {}: {e}", flags.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or(flags.listen.clone());
    let redis_state = match store.ping().await {
        Ok(()) => "reachable".to_string(),
        Err(e) => {
            format!("UNREACHABLE ({e:?}); answering 503 budget_store_unavailable until it is")
        }
    };
    if flags.check_only {
        eprintln!("llmkube-budgets: WARNING --unsafe-check-only: admissions are not held, budgets can be overshot (tests only)");
    }
    println!(
        "llmkube-budgets: ready on http://{addr}, redis {} {redis_state}",
        flags.redis
    );
    let service = Arc::new(Service { store });
    serve(listener, service, shutdown_signal()).await;
    say("llmkube-budgets: stopped");
    ExitCode::SUCCESS
}

/// One line on stdout; a closed stdout (the supervisor went away) is not a reason to crash.
fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, Ctrl-C via tokio is the fallback.
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
