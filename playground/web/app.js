// The playground page: everything runs here, against the wasm build of the generator and core.
import init, { validate, explain } from "./pkg/llmkube_playground.js";

const $ = (id) => document.getElementById(id);
const fields = { manifest: $("manifest"), path: $("path"), headers: $("headers"), body: $("body"), quarantined: $("quarantined") };
const DEFAULT_BODY = '{"model": "gpt-5", "messages": [{"role": "user", "content": "hello"}]}';

// State <-> URL fragment: base64url of the JSON of every field, so a link reproduces the page.
function encodeState() {
  const state = Object.fromEntries(Object.entries(fields).map(([k, el]) => [k, el.value]));
  const bytes = new TextEncoder().encode(JSON.stringify(state));
  let bin = "";
  bytes.forEach((b) => (bin += String.fromCharCode(b)));
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
function decodeState(s) {
  try {
    const bin = atob(s.replace(/-/g, "+").replace(/_/g, "/"));
    return JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
  } catch {
    return null;
  }
}

function headerPairs(text) {
  return text.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => {
    const i = l.indexOf(":");
    return i < 0 ? [l, ""] : [l.slice(0, i).trim(), l.slice(i + 1).trim()];
  });
}

function list(items, cls) {
  const ul = document.createElement("ul");
  ul.className = "problems";
  for (const p of items) {
    const li = document.createElement("li");
    li.className = cls;
    li.textContent = (cls === "warning" ? "warning: " : "") + p.line;
    ul.append(li);
  }
  return ul;
}

function render() {
  const manifest = fields.manifest.value;
  const v = JSON.parse(validate(manifest));
  const box = $("problems");
  box.replaceChildren();
  if (v.errors.length === 0) {
    const p = document.createElement("p");
    p.className = "valid";
    p.textContent = "valid";
    box.append(p);
  } else {
    box.append(list(v.errors, "error"));
  }
  if (v.warnings.length) box.append(list(v.warnings, "warning"));

  const request = {
    path: fields.path.value || "/v1/chat/completions",
    headers: headerPairs(fields.headers.value),
    body: fields.body.value,
    quarantined: fields.quarantined.value.split(",").map((s) => s.trim()).filter(Boolean),
  };
  const r = JSON.parse(explain(manifest, JSON.stringify(request)));
  const answer = $("answer");
  const tbody = $("rules").querySelector("tbody");
  tbody.replaceChildren();
  if (!r.ok) {
    answer.className = "refused";
    answer.textContent = "No explanation: the manifest is invalid (see Validation).";
    $("rules").hidden = true;
    $("text").textContent = r.errors.map((p) => p.line).join("\n");
    return;
  }
  const ex = r.explanation;
  answer.className = ex.backend ? "ok" : "refused";
  answer.textContent = ex.backend
    ? `${ex.status}: served by backend ${ex.backend}` + (ex.rule ? ` (rule ${ex.rule})` : "") + ` — order ${ex.order.join(" → ")}`
    : `${ex.status}` + (ex.error ? ` ${ex.error.error.code}: ${ex.error.error.message}` : ` (${ex.outcome})`);
  ex.rules.forEach((rule, i) => {
    const tr = document.createElement("tr");
    for (const [text, cls] of [[i + 1], [rule.name], [rule.verdict, rule.verdict], [rule.why]]) {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.className = cls;
      tr.append(td);
    }
    tbody.append(tr);
  });
  $("rules").hidden = ex.rules.length === 0;
  $("text").textContent = r.text;
}

let pending = 0;
function schedule() {
  clearTimeout(pending);
  pending = setTimeout(() => {
    render();
    history.replaceState(null, "", "#" + encodeState());
  }, 150);
}

async function main() {
  await init();
  const state = decodeState(location.hash.slice(1));
  if (state) {
    for (const [k, el] of Object.entries(fields)) if (typeof state[k] === "string") el.value = state[k];
  } else {
    fields.manifest.value = await (await fetch("example.yaml")).text();
    fields.body.value = DEFAULT_BODY;
  }
  for (const el of Object.values(fields)) el.addEventListener("input", schedule);
  $("file").addEventListener("change", async (e) => {
    const f = e.target.files[0];
    if (f) {
      fields.manifest.value = await f.text();
      schedule();
    }
  });
  $("share").addEventListener("click", async () => {
    const url = location.href.split("#")[0] + "#" + encodeState();
    try {
      await navigator.clipboard.writeText(url);
      $("shared").textContent = "link copied";
    } catch {
      $("shared").textContent = url;
    }
  });
  render();
  document.body.dataset.ready = "true";
}
main();
