// What a routed request costs inside V8 alone: the proxy-wasm filter run on node's V8 (TurboFan,
// the engine Envoy embeds) behind a host whose hostcalls do almost nothing (JavaScript stubs that
// hand over the same header maps and bodies as testharness/host/examples/request_cost.rs). Envoy's
// own work per hostcall is left out on purpose: that is bench/hostcalls.py's price list. So the
// time per request here is the guest's instructions plus V8's call boundaries (one entry per
// callback, one exit per hostcall, one more entry per buffer the host copies in via
// proxy_on_memory_allocate), and µs per request ÷ the module's wasmtime fuel is V8's cost per
// wasm instruction.
//
//   node --no-liftoff bench/v8_request.mjs --config PLUGIN.json --body BODY.json \
//        --wasm A.wasm[,B.wasm,...] [--requests 4000] [--rounds 9]
//
// Each module gets its own instance; rounds interleave the modules; each round times
// `--requests` requests back to back (after a warm-up of the same size) and the median round is
// reported (CPU time), with the hostcalls per request by name and the time per callback (wall time,
// best round each).

import fs from "node:fs";
import { performance } from "node:perf_hooks";

const args = process.argv.slice(2);
const arg = (name, dflt) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : dflt;
};
const config = fs.readFileSync(arg("--config"));
const body = fs.readFileSync(arg("--body"));
const wasms = arg("--wasm").split(",");
const REQUESTS = Number(arg("--requests", "4000"));
const ROUNDS = Number(arg("--rounds", "9"));

const OK = 0, NOT_FOUND = 1, EMPTY = 7;
const enc = new TextEncoder();
const dec = new TextDecoder();

// The proxy-wasm map serialisation: count, (name len, value len)*, then name\0value\0 each.
function serialise(pairs) {
    const kv = pairs.map(([k, v]) => [enc.encode(k), enc.encode(v)]);
    let size = 4 + 8 * kv.length;
    for (const [k, v] of kv) size += k.length + v.length + 2;
    const out = new Uint8Array(size);
    const dv = new DataView(out.buffer);
    dv.setUint32(0, kv.length, true);
    let at = 4 + 8 * kv.length;
    kv.forEach(([k, v], i) => {
        dv.setUint32(4 + 8 * i, k.length, true);
        dv.setUint32(8 + 8 * i, v.length, true);
        out.set(k, at); at += k.length + 1;
        out.set(v, at); at += v.length + 1;
    });
    return out;
}

const REQUEST_HEADERS = serialise([
    [":authority", "gateway.example"], [":path", "/v1/chat/completions"], [":method", "POST"],
    [":scheme", "http"], ["user-agent", "wrk"], ["content-type", "application/json"],
    ["content-length", String(body.length)], ["x-forwarded-proto", "http"],
    ["x-request-id", "0f6c4b8e-3f3c-4d8e-9a57-2b1f5d0c9e11"],
]);
const RESPONSE = enc.encode('{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":200,"completion_tokens":16,"total_tokens":216}}');
const RESPONSE_HEADERS = serialise([
    [":status", "200"], ["content-type", "application/json"],
    ["content-length", String(RESPONSE.length)], ["x-envoy-upstream-service-time", "1"],
]);

function load(path) {
    const module = new WebAssembly.Module(fs.readFileSync(path));
    const calls = new Map();
    let inst, ex;
    // Views of guest memory, made again only when it grew (no garbage per hostcall).
    let buf = null, view = null, bytes = null;
    const mem = () => {
        if (buf !== ex.memory.buffer) {
            buf = ex.memory.buffer;
            view = new DataView(buf);
            bytes = new Uint8Array(buf);
        }
        return view;
    };
    const u8 = () => (mem(), bytes);
    const count = (name) => calls.set(name, (calls.get(name) || 0) + 1);
    // Copies `bytes` into guest memory as Envoy does (the guest's allocator), and stores the
    // pointer and size at the two return addresses.
    const give = (data, ptrAt, sizeAt) => {
        const p = ex.proxy_on_memory_allocate(data.length);
        u8().set(data, p);
        const m = mem();
        m.setUint32(ptrAt, p, true);
        m.setUint32(sizeAt, data.length, true);
        return OK;
    };
    let clock = 1_700_000_000_000_000_000n;
    const buffers = { 0: body, 1: RESPONSE, 7: config };
    const maps = { 0: REQUEST_HEADERS, 2: RESPONSE_HEADERS };
    const env = new Proxy({}, {
        get(_, name) {
            const f = {
                proxy_log: (level, p, n) => {
                    count("proxy_log");
                    if (level >= 4) console.error(`[${path}] ${dec.decode(new Uint8Array(ex.memory.buffer, p, n))}`);
                    return OK;
                },
                proxy_get_log_level: (at) => { count("proxy_get_log_level"); mem().setUint32(at, 3, true); return OK; },
                proxy_get_current_time_nanoseconds: (at) => {
                    count("proxy_get_current_time_nanoseconds");
                    clock += 1000n;
                    mem().setBigUint64(at, clock, true);
                    return OK;
                },
                proxy_get_buffer_bytes: (type, start, max, ptrAt, sizeAt) => {
                    count("proxy_get_buffer_bytes");
                    const b = buffers[type];
                    if (!b) return NOT_FOUND;
                    // Sizes are the guest's usize (u32): usize::MAX arrives as -1.
                    const from = Math.min(b.length, start >>> 0);
                    return give(b.subarray(from, Math.min(b.length, from + (max >>> 0))), ptrAt, sizeAt);
                },
                proxy_get_header_map_pairs: (type, ptrAt, sizeAt) => {
                    count("proxy_get_header_map_pairs");
                    return give(maps[type] || serialise([]), ptrAt, sizeAt);
                },
                proxy_define_metric: (_t, _p, _n, at) => { count("proxy_define_metric"); mem().setUint32(at, calls.get("proxy_define_metric"), true); return OK; },
                proxy_register_shared_queue: (_p, _n, at) => { count("proxy_register_shared_queue"); mem().setUint32(at, 1, true); return OK; },
                proxy_get_shared_data: () => { count("proxy_get_shared_data"); return NOT_FOUND; },
                proxy_get_property: () => { count("proxy_get_property"); return NOT_FOUND; },
                proxy_resolve_shared_queue: () => { count("proxy_resolve_shared_queue"); return NOT_FOUND; },
                proxy_dequeue_shared_queue: () => { count("proxy_dequeue_shared_queue"); return EMPTY; },
                proxy_send_local_response: () => { throw new Error(`${path}: the request was answered locally`); },
            }[name];
            return f || ((..._) => { count(name); return OK; });
        },
    });
    const wasi = {
        random_get: (p, n) => { u8().fill(7, p, p + n); return 0; },
        environ_sizes_get: (a, b) => { mem().setUint32(a, 0, true); mem().setUint32(b, 0, true); return 0; },
        environ_get: () => 0,
        fd_write: () => 0,
        proc_exit: (c) => { throw new Error(`proc_exit ${c}`); },
    };
    inst = new WebAssembly.Instance(module, { env, wasi_snapshot_preview1: wasi });
    ex = inst.exports;
    ex._initialize && ex._initialize();
    ex.proxy_on_context_create(1, 0);
    if (ex.proxy_on_vm_start) ex.proxy_on_vm_start(1, 0);
    if (!ex.proxy_on_configure(1, config.length)) throw new Error(`${path}: configure failed`);
    let next = 2;
    const phases = new Float64Array(7);
    // One request and its response, as request_cost's `one`; `timed`: time each callback.
    const one = (timed) => {
        const id = next++;
        const t = timed ? [performance.now()] : null;
        ex.proxy_on_context_create(id, 1);
        if (timed) t.push(performance.now());
        ex.proxy_on_request_headers(id, 9, 0);
        if (timed) t.push(performance.now());
        ex.proxy_on_request_body(id, body.length, 1);
        if (timed) t.push(performance.now());
        ex.proxy_on_response_headers(id, 4, 0);
        if (timed) t.push(performance.now());
        ex.proxy_on_response_body(id, RESPONSE.length, 1);
        if (timed) t.push(performance.now());
        ex.proxy_on_log(id);
        if (timed) t.push(performance.now());
        ex.proxy_on_done(id);
        ex.proxy_on_delete(id);
        if (timed) {
            t.push(performance.now());
            for (let i = 0; i < 7; i++) phases[i] += t[i + 1] - t[i];
        }
    };
    return { path, one, calls, phases };
}

const filters = wasms.map(load);
const NAMES = ["context create", "request headers", "request body", "response headers",
    "response body", "log", "done + delete"];
// Per module: per round, the µs per request of each callback (timed one by one: the clock reads
// add about 0.05 µs per callback) and of the whole request.
const rounds = filters.map(() => []);
for (const f of filters) for (let i = 0; i < REQUESTS; i++) f.one(true);
const before = filters.map((f) => new Map(f.calls));
for (let r = 0; r < ROUNDS; r++) {
    filters.forEach((f, k) => {
        f.phases.fill(0);
        // The round's CPU time (not wall time: on a busy machine the process is not always
        // running, and wall time would count the waits).
        const c0 = process.cpuUsage();
        for (let i = 0; i < REQUESTS; i++) f.one(true);
        const c = process.cpuUsage(c0);
        const ph = [...f.phases].map((x) => (x * 1000) / REQUESTS);
        rounds[k].push({ total: (c.user + c.system) / REQUESTS, ph });
    });
}
filters.forEach((f, k) => {
    const rs = rounds[k];
    const totals = rs.map((r) => r.total).sort((a, b) => a - b);
    // CPU time per request (the process's, so the harness's own loop and clock reads too), best
    // round; each callback by wall time in its best round (the least disturbed one).
    console.log(`== ${f.path}: ${totals[0].toFixed(2)} µs CPU per request (best of ${ROUNDS} rounds of ` +
        `${REQUESTS}; median ${totals[ROUNDS >> 1].toFixed(2)}, worst ${totals[ROUNDS - 1].toFixed(2)})`);
    NAMES.forEach((p, i) => console.log(`    ${p.padEnd(22)} ${Math.min(...rs.map((r) => r.ph[i])).toFixed(2)} µs`));
    let total = 0;
    for (const [name, c] of f.calls) {
        const d = (c - (before[k].get(name) || 0)) / (REQUESTS * ROUNDS);
        if (d > 0) { total += d; console.log(`    hostcall ${name.padEnd(37)} ${d.toFixed(2)}`); }
    }
    console.log(`    hostcalls per request                  ${total.toFixed(2)}`);
});
