// feedproc dashboard: refresh the live part of the page, draw the charts, and send actions to the
// API with the API token. Server-rendered (escaped) HTML is swapped in; anything this script writes
// itself uses textContent.
(function () {
  "use strict";
  const TOKEN = "feedproc-api-token";
  const CHART_REFRESH_MS = 15000;
  const live = document.getElementById("live");
  const flash = document.getElementById("flash");
  const state = document.getElementById("live-state");
  const tokenInput = document.getElementById("token");
  const src = live.dataset.src;
  const every = parseInt(live.dataset.refresh || "2000", 10);

  tokenInput.value = sessionStorage.getItem(TOKEN) || "";
  tokenInput.addEventListener("input", () => sessionStorage.setItem(TOKEN, tokenInput.value.trim()));
  document.getElementById("token-form").addEventListener("submit", (e) => e.preventDefault());

  function say(text, kind) {
    flash.textContent = text;
    flash.className = kind || "";
  }

  let busy = false;
  async function refresh() {
    if (!src || busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(src, { headers: { Accept: "text/html" }, cache: "no-store" });
      if (response.ok) {
        const html = await response.text();
        // Never swap under the operator's typing; keep open tracebacks open.
        const focused = document.activeElement;
        const typing = live.contains(focused) && /^(INPUT|SELECT|TEXTAREA)$/.test(focused.tagName);
        if (!typing) {
          const open = new Set();
          live.querySelectorAll("details").forEach((d, i) => { if (d.open) open.add(i); });
          live.innerHTML = html;
          live.querySelectorAll("details").forEach((d, i) => { if (open.has(i)) d.open = true; });
        }
        state.className = "live-dot";
        state.textContent = "live";
      } else {
        state.className = "live-dot stale";
        state.textContent = "HTTP " + response.status;
      }
    } catch (error) {
      state.className = "live-dot stale";
      state.textContent = "offline";
    } finally {
      busy = false;
    }
  }

  function token(what) {
    const value = tokenInput.value.trim();
    if (!value) {
      say("Enter an operate token (FEEDPROC_OPERATE_TOKENS or FEEDPROC_API_TOKEN) to " + what + ".", "error");
      tokenInput.focus();
    }
    return value;
  }

  async function post(path, body, what, done, method = "POST") {
    const value = token(what);
    if (!value) return;
    try {
      const headers = { Authorization: "Bearer " + value };
      if (body !== undefined) headers["Content-Type"] = "application/json";
      const response = await fetch("/api/v1" + path, {
        method: method,
        headers: headers,
        // A string is JSON already (a 64-bit priority, which a JavaScript number cannot hold).
        body: body === undefined || typeof body === "string" ? body : JSON.stringify(body),
      });
      const answer = await response.json().catch(() => ({}));
      if (response.ok) say(done(answer), "ok");
      else say(what + ": " + (answer.error || "HTTP " + response.status), "error");
    } catch (error) {
      say(what + ": " + error, "error");
    } finally {
      refresh();
    }
  }

  function actOnPartition(button) {
    const key = button.dataset.key;
    const action = button.dataset.action;
    const path = "/partitions/" + encodeURIComponent(key);
    if (action === "cancel" && !window.confirm("Cancel partition " + key + "?")) return;
    if (action === "resubmit" && !window.confirm("Run partition " + key + " again from its first gate?")) return;
    if (action === "remove") {
      if (!window.confirm("Delete partition " + key + " with its items and history?")) return;
      return post(path, undefined, "remove " + key, () => "Removed " + key + ".", "DELETE");
    }
    return post(path + "/" + action, undefined, action + " " + key, (body) =>
      action === "retry" ? "Retrying " + key + ": " + body.retried + " failed items are available again."
      : action === "resubmit" ? "Resubmitted " + key + ": " + body.resubmitted + " items are available again."
                              : "Cancelled " + key + ".");
  }

  function actOnItem(button) {
    const id = button.dataset.item;
    const action = button.dataset.itemAction;
    if (action !== "retry" && !window.confirm(action[0].toUpperCase() + action.slice(1) + " item " + id + "?")) return;
    const past = { retry: "Retrying", skip: "Skipped", cancel: "Cancelled" }[action];
    return post("/items/" + id + "/" + action, undefined, action + " item " + id, () => past + " item " + id + ".");
  }

  function actOnQueue(button) {
    const queue = button.dataset.queue;
    const action = button.dataset.queueAction;
    if (action === "pause" && !window.confirm("Pause queue " + queue + "? Nothing new is dispatched until it is resumed.")) return;
    return post("/queues/" + encodeURIComponent(queue) + "/" + action, undefined, action + " " + queue, () =>
      (action === "pause" ? "Paused " : "Resumed ") + queue + ".");
  }

  function actOnHook(button) {
    if (button.dataset.hookAction === "retry-failed") {
      if (!window.confirm("Retry every failed hook?")) return;
      return post("/hooks/retry", { failed: true }, "retry failed hooks", (body) =>
        "Retrying " + body.retried + " failed hooks.");
    }
    const id = button.dataset.hook;
    return post("/hooks/" + id + "/retry", undefined, "retry hook " + id, () => "Retrying hook " + id + ".");
  }

  function retryFailed(button) {
    const filter = {};
    for (const name of ["queue", "prefix", "error"]) if (button.dataset[name]) filter[name] = button.dataset[name];
    if (!window.confirm("Retry up to 500 failed partitions" + (Object.keys(filter).length ? " matching the filter" : "") + "?")) return;
    return post("/failures/retry", { ...filter, limit: 500 }, "retry failed partitions", (body) =>
      "Retrying " + body.retried.length + " failed partitions.");
  }

  // A partition's priority: a signed 64-bit integer, sent as written (BigInt checks and normalises it).
  document.addEventListener("submit", async (event) => {
    const form = event.target.closest("form[data-priority-key]");
    if (!form) return;
    event.preventDefault();
    const key = form.dataset.priorityKey;
    const text = form.elements.priority.value.trim();
    let value;
    try {
      value = /^[+-]?[0-9]{1,19}$/.test(text) ? BigInt(text) : null;
    } catch (error) {
      value = null;
    }
    if (value === null || value < -(2n ** 63n) || value > 2n ** 63n - 1n) {
      say("priority must be an integer from -9223372036854775808 to 9223372036854775807, got " + JSON.stringify(text), "error");
      return;
    }
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      await post("/partitions/" + encodeURIComponent(key) + "/priority", '{"priority": ' + value.toString() + "}",
        "set the priority of " + key, () => "Priority of " + key + " set to " + value.toString() + ".");
    } finally {
      button.disabled = false;
    }
  });

  document.addEventListener("click", async (event) => {
    const button = event.target.closest(
      "button[data-action], button[data-item-action], button[data-queue-action], button[data-hook-action], button[data-bulk]");
    if (!button) return;
    button.disabled = true;
    try {
      if (button.dataset.action) await actOnPartition(button);
      else if (button.dataset.itemAction) await actOnItem(button);
      else if (button.dataset.queueAction) await actOnQueue(button);
      else if (button.dataset.hookAction) await actOnHook(button);
      else await retryFailed(button);
    } finally {
      button.disabled = false;
    }
  });

  // ------------------------------------------------------------ charts (uPlot, bundled)

  const SERIES = [
    { label: "completed", stroke: "#1a7f37", fill: "rgba(26,127,55,.12)" },
    { label: "failed", stroke: "#cf222e" },
    { label: "added", stroke: "#8250df" },
    { label: "backlog", stroke: "#0969da", scale: "backlog", dash: [4, 3] },
  ];

  function columns(body) {
    const b = body.buckets;
    return [
      b.map((x) => Date.parse(x.at) / 1000),
      b.map((x) => x.completed),
      b.map((x) => x.failed),
      b.map((x) => x.added),
      b.map((x) => x.backlog),
    ];
  }

  async function drawChart(figure) {
    let body;
    try {
      const response = await fetch(figure.dataset.src, { cache: "no-store" });
      if (!response.ok) return;
      body = await response.json();
    } catch (error) {
      return;
    }
    const data = columns(body);
    if (figure.plot) {
      figure.plot.setData(data);
      return;
    }
    if (typeof uPlot === "undefined") return;
    const holder = figure.querySelector(".plot");
    const options = {
      width: Math.max(holder.clientWidth, 300),
      height: 170,
      series: [{}, ...SERIES.map((s) => ({ ...s, width: 1.5, points: { show: false } }))],
      axes: [
        {},
        { label: "items / " + (body.step >= 3600 ? body.step / 3600 + "h" : body.step / 60 + " min"), size: 60 },
        { scale: "backlog", side: 1, label: "backlog", grid: { show: false }, size: 60 },
      ],
      scales: { backlog: { auto: true } },
      legend: { live: true },
    };
    figure.plot = new uPlot(options, data, holder);
    figure.dataset.drawn = "yes";
  }

  function drawCharts() {
    if (document.hidden) return;
    document.querySelectorAll("figure.chart").forEach(drawChart);
  }

  window.addEventListener("load", drawCharts);
  window.addEventListener("resize", () => {
    document.querySelectorAll("figure.chart").forEach((figure) => {
      if (figure.plot) figure.plot.setSize({ width: Math.max(figure.querySelector(".plot").clientWidth, 300), height: 170 });
    });
  });
  if (document.querySelector("figure.chart")) setInterval(drawCharts, CHART_REFRESH_MS);
  if (src) setInterval(refresh, every);
})();
