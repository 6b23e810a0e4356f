// Drives the playground in Debian's headless Chromium: a valid router, an invalid one with its
// problem lines, a pii request that must stay local, a 404, and a shared link restoring the page.
// Usage: node test.mjs URL SCREENSHOT_DIR
import { chromium } from "playwright-core";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const [url, shots] = process.argv.slice(2);
const example = readFileSync(new URL("../web/example.yaml", import.meta.url), "utf8");
const profile = mkdtempSync(join(tmpdir(), "playground-chromium-"));
// A persistent context is how playwright takes a fresh --user-data-dir.
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1400, height: 1100 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage();
const outside = [];
page.on("request", (r) => { if (!r.url().startsWith(url.replace(/\/$/, ""))) outside.push(r.url()); });
page.on("pageerror", (e) => { throw e; });

async function setFields(values) {
  for (const [id, v] of Object.entries(values)) await page.fill(`#${id}`, v);
  // Renders are debounced; wait for the fragment to carry the new state.
  await page.waitForTimeout(400);
}
const text = (sel) => page.locator(sel).innerText();

let passed = 0;
async function check(name, fn) {
  await fn();
  passed++;
  console.log(`ok - ${name}`);
}

await page.goto(url);
await page.waitForSelector("body[data-ready=true]");

await check("the example router is valid and explains the default body", async () => {
  // No errors; warnings (such as a local backend whose served model name is unknown) may follow.
  assert.match((await text("#problems")).trim(), /^valid(\s+warning: [^\n]+)*$/);
  assert.match(await text("#answer"), /^200: served by backend gpt \(rule cloud-models\)/);
});

await check("an invalid router lists its problem lines with field paths", async () => {
  await setFields({ manifest: example.replace("defaultRoute: small", "defaultRoute: nope").replace("name: regulated", "name: Bad_Name") });
  const problems = await text("#problems");
  assert.match(problems, /ModelRouter\/demo: spec\.defaultRoute: backend "nope" is not declared in spec\.backends/);
  assert.match(problems, /ModelRouter\/demo: spec\.rules\[0\]\.name: /);
  assert.match(await text("#answer"), /manifest is invalid/);
});

await check("a pii request stays on a local backend", async () => {
  await setFields({ manifest: example, headers: "x-llmkube-classification: pii\nx-team: research",
    body: '{"model": "gpt-5", "messages": []}' });
  assert.match(await text("#answer"), /^200: served by backend big \(rule regulated\)/);
  const rules = await text("#rules");
  assert.match(rules, /regulated\s+matched/);
  assert.match(await text("#text"), /sensitive: local backends only/);
  await page.screenshot({ path: join(shots, "screenshot.png"), fullPage: true });
});

await check("an unknown model without a default route is 404", async () => {
  await setFields({ manifest: example.replace("  defaultRoute: small\n", ""), headers: "",
    body: '{"model": "no-such-model"}' });
  assert.match(await text("#answer"), /^404 model_not_found/);
  assert.match(await text("#rules"), /cloud-models\s+no-match\s+the model matches none of \["gpt-\*"\]/);
});

await check("the URL fragment restores the page", async () => {
  const shared = page.url();
  assert.ok(shared.includes("#"));
  const other = await browser.newPage();
  await other.goto(shared);
  await other.waitForSelector("body[data-ready=true]");
  assert.match(await other.locator("#answer").innerText(), /^404 model_not_found/);
  assert.equal(await other.inputValue("#body"), '{"model": "no-such-model"}');
  await other.close();
});

await check("nothing left the page's origin", async () => {
  assert.deepEqual(outside, []);
});

await browser.close();
console.log(`${passed} passed`);
