// agentmesh ack monitor dashboard: polls the JSON API every 2 s and
// redraws. No dependencies, no build step. Every number shown carries a
// data-value attribute with the raw API value so tests can compare.
"use strict";
(function () {
  const POLL_MS = 2000;
  const $ = (sel, root) => (root || document).querySelector(sel);
  const pct = (v) => (v * 100).toFixed(1) + "%";
  const ms = (v) => (v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 2 : 0) + " ms");
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const ago = (t) => {
    if (!t) return "";
    const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
    return s < 90 ? Math.round(s) + "s ago" : s < 5400 ? Math.round(s / 60) + "m ago" : Math.round(s / 3600) + "h ago";
  };
  const fmt = { ack_rate: pct, nack_rate: pct, timeout_rate: pct, avg_ack_time_ms: ms, avg_latency_ms: ms, lag_seconds: (v) => ms(v * 1000) };

  function setField(el, field, value) {
    el.dataset.value = String(value);
    el.textContent = fmt[field] ? fmt[field](value) : String(value);
  }
  function cell(field, value, cls, blank) {
    const text = blank ? "–" : fmt[field] ? fmt[field](value) : String(value);
    return `<td data-field="${field}" data-value="${esc(value)}"${cls ? ` class="${cls}"` : ""}>${esc(text)}</td>`;
  }
  // The alert thresholds (the summary's), the defaults until it arrives.
  let th = { ack_warning: 0.95, ack_critical: 0.9, timeout_warning: 0.05, timeout_critical: 0.1 };
  function ackClass(r) { return r.resolved === 0 ? "" : r.ack_rate < th.ack_critical ? "bad" : r.ack_rate < th.ack_warning ? "warn" : "good"; }
  function toClass(r) { return r.resolved === 0 ? "" : r.timeout_rate > th.timeout_critical ? "bad" : r.timeout_rate > th.timeout_warning ? "warn" : "good"; }
  function setCard(name, cls) {
    const el = $(`#summary [data-card="${name}"]`);
    el.classList.remove("bad", "warn", "good");
    if (cls) el.classList.add(cls);
    el.dataset.state = cls || "none";
  }

  async function get(path) {
    const res = await fetch(path, { cache: "no-store" });
    if (!res.ok) throw new Error(path + ": " + res.status);
    return res.json();
  }

  function renderSummary(s) {
    const root = $("#summary");
    const w = s.window;
    for (const el of root.querySelectorAll("[data-field]")) {
      const f = el.dataset.field;
      const v = f in w ? w[f] : s[f];
      if (v !== undefined) setField(el, f, v);
    }
    if (s.thresholds) th = s.thresholds;
    setCard("ack_rate", ackClass(w));
    setCard("timeout_rate", toClass(w));
    setCard("active_alerts", s.active_alerts > 0 ? "bad" : "good");
    setCard("unknown_receivers", s.unknown_receivers > 0 ? "warn" : "good");
    const role = $("#role");
    role.textContent = s.monitor + (s.active ? " (active)" : " (standby)");
    role.className = s.active ? "active" : "standby";
    $("#window").textContent = Math.round(s.window_seconds) + " s";
    $("#updated").textContent = new Date(s.generated_at).toLocaleTimeString();
    document.body.dataset.generatedAt = s.generated_at;
  }

  function renderAgents(data) {
    const rows = [];
    for (const a of data.agents) {
      for (const p of a.priorities) {
        const w = p.window, t = p.total;
        const flag = a.unavailable_since ? `<span class="unavailable" title="${esc(a.unavailable_reason)}">potentially unavailable</span>` : "";
        rows.push(`<tr data-agent="${esc(a.agent)}" data-priority="${esc(p.priority)}">` +
          `<td>${esc(a.agent)}${flag}</td><td>${esc(p.priority)}</td>` +
          cell("sent", w.sent) + cell("acked", w.acked) + cell("nacked", w.nacked) + cell("timed_out", w.timed_out) +
          cell("pending", w.pending) + cell("naks", w.naks) + cell("delivery_timeouts", w.delivery_timeouts) +
          cell("late_acks", w.late_acks) + cell("ack_rate", w.ack_rate, ackClass(w), w.resolved === 0) +
          cell("timeout_rate", w.timeout_rate, toClass(w), w.resolved === 0) +
          cell("avg_ack_time_ms", w.avg_ack_time_ms, "", w.acked === 0) +
          cell("avg_latency_ms", w.avg_latency_ms, "", w.acked === 0) +
          `<td data-field="total" data-acked="${t.acked}" data-resolved="${t.resolved}">${t.acked} / ${t.resolved}</td></tr>`);
      }
    }
    $("#agents tbody").innerHTML = rows.length ? rows.join("") : `<tr class="empty"><td colspan="15">no traffic yet</td></tr>`;
  }

  function renderAlerts(data) {
    const items = data.alerts.map((a) =>
      `<li data-alert="${esc(a.id)}" data-agent="${esc(a.agent)}" data-kind="${esc(a.kind)}" data-severity="${esc(a.severity)}">` +
      `<span class="sev ${esc(a.severity)}">${esc(a.severity)}</span><b>${esc(a.agent)}</b> ${esc(a.kind.replace("_", " "))} ` +
      `${pct(a.value)} (threshold ${pct(a.threshold)}, ${a.samples} messages) <span class="mute">${ago(a.raised_at)}</span></li>`);
    $("#alerts").innerHTML = items.length ? items.join("") : `<li class="empty">none</li>`;
  }

  function renderUnknown(data) {
    const items = data.unknown_receivers.map((u) =>
      `<li data-receiver="${esc(u.receiver)}" data-value="${u.messages}"><b>${esc(u.receiver)}</b> · ${u.messages} messages, ` +
      `the latest from <b>${esc(u.last_sender)}</b> (${esc(u.last_priority)}) <span class="mute">${ago(u.last_sent_at)} · ${esc(u.last_message_id)}</span></li>`);
    $("#unknown").innerHTML = items.length ? items.join("") : `<li class="empty">none</li>`;
  }

  function renderEscalations(data) {
    const items = data.escalations.map((r) =>
      `<li data-escalation="${esc(r.escalation_id)}"><b>${esc(r.sender_agent)}</b> → <b>${esc(r.receiver_agent)}</b> ` +
      `${esc(r.priority)} · ${r.deliveries} attempts · escalated to <b>${esc(r.director)}</b> ` +
      `<span class="mute">${ago(r.escalated_at)} · ${esc(r.message_id)}</span></li>`);
    $("#escalations").innerHTML = items.length ? items.join("") : `<li class="empty">none</li>`;
  }

  function renderDLQ(data) {
    const rows = data.dead_letters.map((r) =>
      `<tr data-dlq-seq="${r.dlq_seq}"><td>${r.dlq_seq}</td><td>${esc(r.message_id)}</td>` +
      `<td>${esc(r.sender_agent)} → ${esc(r.receiver_agent)}</td><td>${esc(r.priority)}</td><td>${esc(r.ack_status)}</td>` +
      `<td>${r.deliveries}</td><td>${esc(r.nack_reason || (r.ack_status === "TIMEOUT" ? "max deliveries" : ""))}</td>` +
      `<td>${ago(r.handled_at)}</td></tr>`);
    $("#dlq tbody").innerHTML = rows.length ? rows.join("") : `<tr class="empty"><td colspan="8">none</td></tr>`;
  }

  function renderChart(data) {
    const svg = $("#chart-svg");
    const W = 900, H = 220, P = 28;
    const step = data.step_seconds * 1000, end = Math.floor(Date.now() / step) * step, n = Math.round(data.range_seconds / data.step_seconds);
    const byT = new Map(data.points.map((p) => [new Date(p.at).getTime(), p]));
    const pts = [];
    for (let i = n - 1; i >= 0; i--) {
      const t = end - i * step;
      pts.push(byT.get(t) || { at: t, acked: 0, nacked: 0, timed_out: 0, avg_ack_time_ms: 0 });
    }
    const maxY = Math.max(1, ...pts.map((p) => p.acked + p.nacked + p.timed_out));
    const maxT = Math.max(1, ...pts.map((p) => p.avg_ack_time_ms));
    const bw = (W - 2 * P) / pts.length;
    let out = `<line x1="${P}" y1="${H - P}" x2="${W - P}" y2="${H - P}" stroke="#2a3440"/>` +
      `<text x="${P - 4}" y="${P}" fill="#8a99a8" font-size="10" text-anchor="end">${maxY}</text>` +
      `<text id="chart-y-unit" x="${P}" y="${P - 12}" fill="#8a99a8" font-size="10">messages per ${data.step_seconds} s</text>` +
      `<text id="chart-y2-unit" x="${W - P}" y="${P - 12}" fill="#58a6ff" font-size="10" text-anchor="end">avg ack time (ms)</text>` +
      `<text x="${P - 4}" y="${H - P}" fill="#8a99a8" font-size="10" text-anchor="end">0</text>` +
      `<text x="${W - P + 4}" y="${P}" fill="#58a6ff" font-size="10">${ms(maxT)}</text>` +
      `<text x="${P}" y="${H - P + 14}" fill="#8a99a8" font-size="10">${new Date(end - (n - 1) * step).toLocaleTimeString()}</text>` +
      `<text x="${W - P}" y="${H - P + 14}" fill="#8a99a8" font-size="10" text-anchor="end">${new Date(end).toLocaleTimeString()}</text>`;
    const line = [];
    pts.forEach((p, i) => {
      const x = P + i * bw;
      let y = H - P;
      for (const [k, color] of [["acked", "#3fb950"], ["nacked", "#d29922"], ["timed_out", "#f85149"]]) {
        const h = (p[k] / maxY) * (H - 2 * P);
        if (h > 0) out += `<rect x="${x + 1}" y="${y - h}" width="${Math.max(1, bw - 2)}" height="${h}" fill="${color}"><title>${k}: ${p[k]}</title></rect>`;
        y -= h;
      }
      if (p.acked > 0) line.push(`${x + bw / 2},${H - P - (p.avg_ack_time_ms / maxT) * (H - 2 * P)}`);
    });
    if (line.length > 1) out += `<polyline points="${line.join(" ")}" fill="none" stroke="#58a6ff" stroke-width="1.5"/>`;
    svg.innerHTML = out;
    svg.dataset.points = String(data.points.length);
  }

  async function tick() {
    try {
      const [s, a, al, e, d, ts, u] = await Promise.all([get("/api/v1/summary"), get("/api/v1/agents"), get("/api/v1/alerts"),
        get("/api/v1/escalations?limit=20"), get("/api/v1/dlq?limit=20"), get("/api/v1/timeseries?range=30m&step=30s"),
        get("/api/v1/unknown_receivers")]);
      renderSummary(s); renderAgents(a); renderAlerts(al); renderUnknown(u); renderEscalations(e); renderDLQ(d); renderChart(ts);
      document.body.dataset.ready = "1";
    } catch (err) {
      $("#updated").textContent = "error: " + err.message;
    } finally {
      setTimeout(tick, POLL_MS);
    }
  }
  tick();
})();
