// The dashboard in a real browser: starts `tollgate serve` ($TOLLGATE_BIN), puts it under
// load, drives headless Chromium (/usr/bin/chromium through playwright-core) to /ui, logs
// in with the admin key, checks that the numbers change while the load runs and that they
// match /v1/admin/inspect once it stops, that the charts draw the decisions over time, and
// that no element is wider than its card at 800, 1,400 and 1,900 px, saving a screenshot
// at each width ($UI_SCREENSHOT_DIR/dashboard-WIDTH.png).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import net from "node:net";
import assert from "node:assert/strict";

const require = createRequire(join(process.env.UI_NODE_MODULES, "x.js"));
const { chromium } = require("playwright-core");

const ADMIN = "ui-admin-key";
const dir = mkdtempSync(join(tmpdir(), "tollgate-ui-"));
const config = {
  auth: {
    callers: { "acme-key": "acme", "globex-key": "globex" },
    workers: { "worker-key": "w1" },
    admins: [ADMIN],
  },
  global: { requests: { capacity: 100000, refill_per_s: 100000 }, concurrency: 64 },
  tenant_defaults: {
    requests: { capacity: 400, refill_per_s: 200 },
    tokens: { capacity: 10000000, refill_per_s: 1000000 },
    queue_limit: 1000,
  },
  // A long tenant name: its buckets' names are the longest words the cards must hold.
  tenants: { acme: { weight: 2 }, globex: {}, "research-and-development-eu-west-nightly-batch": {} },
  // A gateway model served by two deployments (never called here): their health shows.
  gateway: {
    upstreams: { east: { base_url: "http://127.0.0.1:9/v1" }, west: { base_url: "http://127.0.0.1:9/v1" } },
    models: { "gpt-4o-mini": { deployments: [
      { name: "east", upstream: "east", max_concurrency: 4 },
      { name: "west", upstream: "west", max_concurrency: "adaptive" },
    ] } },
  },
};
writeFileSync(join(dir, "tollgate.json"), JSON.stringify(config));

const port = await new Promise((resolve) => {
  const s = net.createServer().listen(0, "127.0.0.1", () => {
    const p = s.address().port;
    s.close(() => resolve(p));
  });
});
const base = `http://127.0.0.1:${port}`;
const server = spawn(process.env.TOLLGATE_BIN, [
  "serve", "--config", join(dir, "tollgate.json"), "--db", join(dir, "t.db"), "--listen", `127.0.0.1:${port}`,
], { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, RUST_LOG: "warn" } });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function api(path, key, init = {}) {
  const r = await fetch(base + path, {
    ...init,
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...(init.headers || {}) },
  });
  return { status: r.status, body: await r.json().catch(() => null) };
}

let browser;
try {
  for (let i = 0; ; i++) {
    try { if ((await fetch(base + "/healthz")).ok) break; } catch {}
    assert.ok(i < 200, "the server did not start");
    await sleep(50);
  }

  // Load: interactive calls admitted and completed, durable jobs queued, some refusals.
  let loading = true, n = 0;
  const deadline = () => Date.now() + 600000;
  let loadError = null;
  const load = (async () => {
    while (loading) {
      const tenant = n % 3 === 0 ? "globex" : "acme";
      const key = `${tenant}-key`;
      const op = `load-${n++}`;
      const route = n % 4 === 0 ? "durable" : "interactive";
      const admit = await api("/v1/admit", key, { method: "POST", body: JSON.stringify({
        key: op, route, input_tokens: 100, max_output_tokens: 50, deadline_ms: deadline(),
      }) });
      if (admit.body && admit.body.outcome === "accepted") {
        await api(`/v1/operations/${op}/complete`, key, { method: "POST", body: JSON.stringify({
          result: "succeeded", usage: { input_tokens: 100, output_tokens: 20 },
        }) });
      }
      if (n % 50 === 0) await sleep(5);
    }
  })().catch((e) => { loadError = e; });

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(base + "/ui");

  // A wrong key is refused on the page, and nothing is shown.
  await page.fill("#key", "not-a-key");
  await page.click("#login-button");
  await page.waitForFunction(() => document.getElementById("login-error").textContent.length > 0);
  assert.ok(await page.isHidden("#dashboard"), "the dashboard stays hidden for a wrong key");

  await page.fill("#key", ADMIN);
  await page.click("#login-button");
  await page.waitForSelector("#dashboard", { state: "visible" });
  const refreshes = async () => Number(await page.getAttribute("#updated", "data-refreshes") || 0);
  const total = async () => Number(await page.textContent("#decisions-total"));
  await page.waitForFunction(() => Number(document.getElementById("updated").dataset.refreshes || 0) >= 2);
  const first = await total();
  await sleep(2500);
  const second = await total();
  assert.ok(second > first, `decisions should grow under load (${first} then ${second})`);
  const rate = Number(await page.textContent("#decisions-rate"));
  assert.ok(rate > 0, `a positive decision rate under load (${rate})`);
  const accepted = await page.$$eval("#decisions tr", (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
  assert.ok(accepted.some(([o]) => o === "accepted"), "accepted decisions are listed: " + JSON.stringify(accepted));
  assert.ok(accepted.some(([o]) => o === "queued"), "queued decisions are listed");

  loading = false;
  await load;
  assert.equal(loadError, null, "the load ran without errors");
  // Hold one call in flight so that a slot shows, then let the page refresh twice.
  const held = await api("/v1/admit", "globex-key", { method: "POST", body: JSON.stringify({
    key: "held", route: "interactive", input_tokens: 10, max_output_tokens: 10, deadline_ms: deadline(),
  }) });
  assert.equal(held.body.outcome, "accepted");
  const now = await refreshes();
  await page.waitForFunction((k) => Number(document.getElementById("updated").dataset.refreshes) >= k + 2, now);

  const inspect = (await api("/v1/admin/inspect?limit=1", ADMIN)).body;
  const table = async (id) => Object.fromEntries(await page.$$eval(`#${id} tr`, (trs) =>
    trs.map((tr) => [tr.children[0].textContent, Number(tr.children[1].textContent)])));
  const queues = await table("queues");
  const slots = await table("slots");
  assert.deepEqual(queues, inspect.queues, "queue depths match /v1/admin/inspect");
  assert.deepEqual(slots, inspect.slots, "slots match /v1/admin/inspect");
  assert.ok(inspect.queues.acme + inspect.queues.globex > 0, "durable jobs are queued");
  assert.ok(Object.values(inspect.slots).some((v) => v > 0), "a slot is in use");
  const deployments = await page.$$eval("#deployments tr", (trs) =>
    trs.map((tr) => [...tr.children].map((td) => td.textContent)));
  assert.deepEqual(deployments, [
    ["deployment.gpt-4o-mini.east", "healthy", "0", "4"],
    ["deployment.gpt-4o-mini.west", "healthy", "0", "8"],
  ], "deployments as /v1/admin/inspect has them");
  const buckets = await table("buckets");
  assert.deepEqual(Object.keys(buckets).sort(), Object.keys(inspect.buckets).sort());
  assert.equal(await page.textContent("#policy-name"), inspect.policy.name);
  assert.equal(await page.textContent("#policy-sha"), inspect.policy.sha256);

  // Rollback with no earlier policy is refused, and the page says so.
  await page.click("#rollback");
  await page.waitForFunction(() => document.getElementById("policy-status").textContent.includes("refused"));

  // Swap from the page: the server's active policy changes, then rolls back to the first.
  await page.setInputFiles("#swap-file", process.env.SWAP_POLICY);
  await page.click("#swap");
  await page.waitForFunction(() => document.getElementById("policy-status").textContent.startsWith("activated"));
  const swapped = (await api("/v1/admin/policy", ADMIN)).body;
  assert.equal(swapped.name, "quiet-hours", "the component chosen on the page is active");
  await page.waitForFunction((n) => document.getElementById("policy-name").textContent === n, swapped.name);
  await page.click("#rollback");
  await page.waitForFunction(() => document.getElementById("policy-status").textContent.startsWith("rolled back"));
  assert.equal((await api("/v1/admin/policy", ADMIN)).body.sha256, inspect.policy.sha256, "rolled back");

  // The charts drew the decisions by outcome over time.
  const series = await page.$$eval("#chart-decisions polyline", (ls) => ls.map((l) => l.dataset.series));
  assert.ok(series.includes("accepted") && series.includes("queued"), "decision lines: " + series);
  const points = await page.$eval('#chart-decisions polyline[data-series="accepted"]',
    (l) => l.getAttribute("points").trim().split(" ").length);
  assert.ok(points >= 3, `the accepted line has a point per refresh (${points})`);
  assert.ok((await page.$$("#chart-queues polyline")).length >= 2, "a queue line per tenant");
  assert.ok((await page.$$("#chart-levels polyline")).length >= 3, "a token level line per tenant");
  // The waiting room's table lists every band, from inspect's `waiting`.
  const waitingRows = await page.$$eval("#waiting tr", (rs) => rs.map((r) => r.textContent));
  assert.ok(["critical", "standard", "sheddable"].every((b) => waitingRows.some((t) => t.includes("band " + b))),
    "waiting bands: " + waitingRows);

  // No element is wider than its card, at three widths.
  const shots = process.env.UI_SCREENSHOT_DIR || dir;
  for (const width of [800, 1400, 1900]) {
    await page.setViewportSize({ width, height: 1000 });
    const at = await refreshes();
    await page.waitForFunction((k) => Number(document.getElementById("updated").dataset.refreshes) >= k + 2, at);
    const overflow = await page.evaluate(() => {
      const out = [];
      for (const card of document.querySelectorAll("#dashboard > section")) {
        const edge = card.getBoundingClientRect().right + 0.5;
        if (card.scrollWidth > card.clientWidth + 1) out.push(`${card.querySelector("h2").textContent} scrolls`);
        for (const el of card.querySelectorAll("*")) {
          const r = el.getBoundingClientRect();
          if (r.width > 0 && r.right > edge) {
            out.push(`${el.tagName.toLowerCase()}#${el.id} in "${card.querySelector("h2").textContent}": ${r.right.toFixed(0)} > ${edge.toFixed(0)}`);
          }
        }
      }
      if (document.documentElement.scrollWidth > window.innerWidth) out.push("the page scrolls sideways");
      return out;
    });
    assert.deepEqual(overflow, [], `nothing overflows its card at ${width} px`);
    await page.screenshot({ path: join(shots, `dashboard-${width}.png`), fullPage: true });
  }
  console.log(`dashboard: ${second} decisions seen, queues ${JSON.stringify(queues)}, slots ${JSON.stringify(slots)}`);
} finally {
  if (browser) await browser.close();
  server.kill("SIGTERM");
  await new Promise((r) => server.once("exit", r));
  rmSync(dir, { recursive: true, force: true });
}
