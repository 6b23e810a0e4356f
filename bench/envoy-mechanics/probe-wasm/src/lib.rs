//! Experiment-only probe (bench/envoy-mechanics): NOT product code.
//! Plugin configuration: `;`-separated `key=value` pairs, all optional:
//!   tag=NAME              label reported in headers (which instance ran)
//!   set_req=NAME:VALUE    add a request header (credentials test)
//!   rewrite_model=M       buffer the request body and replace the value of "model" with M
//!   drop_cl=1             also remove content-length when rewriting
//!   rewrite_model=@append  model becomes <old>+<backend from upstream host metadata llmkube.backend>
//!   deny_backend=NAME     upstream use: local 503 reply when this attempt's endpoint metadata llmkube.backend == NAME
//!   env_header=H:VAR      set request header H from the VM environment variable VAR (vm_config.environment_variables)
//!   mark=1                add request header x-probe-mark-<backend>: 1 (per-attempt header leak test)
//!   fix_cl=1              pause the headers, rewrite the body, then set content-length to the new size
//!   props=1               on request headers: add x-probe-<tag>-req-<prop> request headers;
//!                         on response headers: add x-probe-<tag>-<prop> response headers
//!   local=CODE            on response headers with status >= 500: replace the response by a JSON error
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::rc::Rc;

#[derive(Default)]
struct Cfg {
    tag: String,
    set_req: Option<(String, String)>,
    rewrite_model: Option<String>,
    drop_cl: bool,
    fix_cl: bool,
    props: bool,
    mark: bool,
    deny_backend: Option<String>,
    env_header: Option<(String, String)>,
    local: Option<u32>,
}

struct Root {
    cfg: Rc<Cfg>,
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { cfg: Rc::new(Cfg::default()) }) });
}}

impl Context for Root {}
impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let raw = self
            .get_plugin_configuration()
            .map(|b| String::from_utf8_lossy(&b).to_string())
            .unwrap_or_default();
        let mut c = Cfg { tag: "p".into(), ..Default::default() };
        for kv in raw.split(';') {
            let mut it = kv.splitn(2, '=');
            let k = it.next().unwrap_or("").trim();
            let v = it.next().unwrap_or("").trim().to_string();
            match k {
                "tag" => c.tag = v,
                "set_req" => {
                    if let Some((a, b)) = v.split_once(':') {
                        c.set_req = Some((a.to_string(), b.to_string()))
                    }
                }
                "rewrite_model" => c.rewrite_model = Some(v),
                "drop_cl" => c.drop_cl = v == "1",
                "fix_cl" => c.fix_cl = v == "1",
                "props" => c.props = v == "1",
                "mark" => c.mark = v == "1",
                "deny_backend" => c.deny_backend = Some(v),
                "env_header" => {
                    if let Some((a, b)) = v.split_once(':') {
                        c.env_header = Some((a.to_string(), b.to_string()))
                    }
                }
                "local" => c.local = v.parse().ok(),
                _ => {}
            }
        }
        self.cfg = Rc::new(c);
        true
    }
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http { cfg: self.cfg.clone() }))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    cfg: Rc<Cfg>,
}

const PROPS: &[(&str, &[&str])] = &[
    ("xds-cluster-name", &["xds", "cluster_name"]),
    ("cluster-name", &["cluster_name"]),
    ("upstream-address", &["upstream", "address"]),
    ("upstream-host-metadata-len", &["xds", "upstream_host_metadata"]),
    ("route-name", &["xds", "route_name"]),
    ("upstream-cluster-metadata-len", &["xds", "cluster_metadata"]),
    ("host-md-backend", &["xds", "upstream_host_metadata", "filter_metadata", "llmkube", "backend"]),
    ("attempts", &["upstream", "request_attempt_count"]),
];

fn prop(path: &[&str]) -> String {
    match hostcalls::get_property(path.to_vec()) {
        Ok(Some(v)) => {
            if v.iter().all(|b| (0x20..0x7f).contains(b)) {
                String::from_utf8_lossy(&v).to_string()
            } else {
                format!("bin:{}", v.len())
            }
        }
        Ok(None) => "none".into(),
        Err(e) => format!("err:{:?}", e),
    }
}

fn add(map: MapType, k: &str, v: &str) {
    let _ = hostcalls::add_map_value(map, k, v);
}

impl Context for Http {}
impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, _eos: bool) -> Action {
        let t = &self.cfg.tag;
        add(MapType::HttpRequestHeaders, &format!("x-probe-{t}-ran"), "1");
        if let Some((k, v)) = &self.cfg.set_req {
            let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, k, Some(v));
        }
        if let Some(d) = &self.cfg.deny_backend {
            let be = prop(&["xds", "upstream_host_metadata", "filter_metadata", "llmkube", "backend"]);
            if &be == d {
                let _ = hostcalls::send_http_response(503, vec![("content-type", "application/json"), ("x-probe-denied", d.as_str())],
                    Some(b"{\"error\":{\"message\":\"refused by upstream filter\",\"type\":\"server_error\",\"param\":null,\"code\":\"fail_closed\"}}"));
                return Action::Pause;
            }
        }
        if let Some((h, var)) = &self.cfg.env_header {
            let v = std::env::var(var).unwrap_or_else(|_| "unset".into());
            let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, h, Some(&v));
        }
        if self.cfg.mark {
            let be = prop(&["xds", "upstream_host_metadata", "filter_metadata", "llmkube", "backend"]);
            add(MapType::HttpRequestHeaders, &format!("x-probe-mark-{be}"), "1");
        }
        if self.cfg.props {
            for (n, p) in PROPS {
                add(MapType::HttpRequestHeaders, &format!("x-probe-{t}-req-{n}"), &prop(p));
            }
        }
        if self.cfg.rewrite_model.is_some() && self.cfg.drop_cl {
            let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, "content-length", None);
        }
        if self.cfg.rewrite_model.is_some() && self.cfg.fix_cl && !_eos {
            return Action::Pause; // hold the headers until the body is rewritten, then fix content-length
        }
        Action::Continue
    }
    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        let Some(m) = &self.cfg.rewrite_model else { return Action::Continue };
        if !eos {
            return Action::Pause;
        }
        let body = match hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size) {
            Ok(Some(b)) => String::from_utf8_lossy(&b).to_string(),
            _ => return Action::Continue,
        };
        // crude: replace the first "model":"..." value
        if let Some(i) = body.find("\"model\"") {
            let rest = &body[i + 7..];
            if let Some(q1) = rest.find('"') {
                if let Some(q2) = rest[q1 + 1..].find('"') {
                    let start = i + 7 + q1 + 1;
                    let end = start + q2;
                    let newm = if m == "@append" {
                        format!("{}+{}", &body[start..end], prop(&["xds", "upstream_host_metadata", "filter_metadata", "llmkube", "backend"]))
                    } else {
                        m.clone()
                    };
                    let nb = format!("{}{}{}", &body[..start], newm, &body[end..]);
                    let st = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, size, nb.as_bytes());
                    if self.cfg.fix_cl {
                        let st2 = hostcalls::set_map_value(MapType::HttpRequestHeaders, "content-length", Some(&nb.len().to_string()));
                        proxy_wasm::hostcalls::log(LogLevel::Info, &format!("probe {} fix_cl {:?}", self.cfg.tag, st2)).ok();
                    }
                    proxy_wasm::hostcalls::log(LogLevel::Info, &format!("probe {} rewrite {:?} {}->{}", self.cfg.tag, st, size, nb.len())).ok();
                }
            }
        }
        Action::Continue
    }
    fn on_http_response_headers(&mut self, _: usize, _eos: bool) -> Action {
        let t = &self.cfg.tag;
        add(MapType::HttpResponseHeaders, &format!("x-probe-{t}-resp"), "1");
        if self.cfg.props {
            for (n, p) in PROPS {
                add(MapType::HttpResponseHeaders, &format!("x-probe-{t}-{n}"), &prop(p));
            }
            add(MapType::HttpResponseHeaders, &format!("x-probe-{t}-response-code"), &prop(&["response", "code"]));
        }
        if let Some(code) = self.cfg.local {
            let status = hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status").ok().flatten().unwrap_or_default();
            if status.starts_with('5') {
                let body = format!("{{\"error\":{{\"message\":\"all backends failed (upstream {status})\",\"type\":\"server_error\",\"param\":null,\"code\":\"all_backends_failed\"}}}}");
                let _ = hostcalls::send_http_response(code, vec![("content-type", "application/json")], Some(body.as_bytes()));
                return Action::Pause;
            }
        }
        Action::Continue
    }
}
