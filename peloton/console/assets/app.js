"use strict";
// The console's pages: one script, no framework. Every value from the daemon goes into the page as text
// (textContent, never HTML). Live updates: server-sent events from WatchJobs (/api/events), which the browser
// resumes after a disconnect with Last-Event-ID.
(function () {
  const main = document.getElementById("main");
  const statusLine = document.getElementById("status");
  let session = null;
  let events = null;
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "KILLED"]);
  // the cluster, queue, pools and hosts views read their answer again when jobs change: at most this often, so
  // that a busy cluster's changes do not turn into a summary of every host a second per browser
  const SLOW_REFRESH_MS = 3000;
  const WATCH_RETRY_MS = 5000;  // a refused event stream is asked for again this much later
  // what each GPU state is called on the map (the API's words: HostGpu.state)
  const GPU_WORDS = { used: "used", free: "free", stranded: "free but stranded", reserved: "reserved for a waiting gang",
                      draining: "draining", drained: "drained", unhealthy: "unhealthy", down: "down" };
  const STATES = ["INITIALIZED", "PENDING", "RUNNING", "FAILING", "KILLING", "SUCCEEDED", "FAILED", "KILLED"];

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function stateBadge(s) { return h("span", { class: "state " + s }, s || "—"); }
  function ago(t) {
    if (!t) return "";
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 60) return Math.round(s) + "s ago";
    if (s < 3600) return Math.round(s / 60) + "m ago";
    if (s < 86400) return (s / 3600).toFixed(1) + "h ago";
    return (s / 86400).toFixed(1) + "d ago";
  }
  function fmt(n) { return Number.isInteger(n) ? String(n) : n.toFixed(1); }
  function until(t) {  // "in 2.0h" for a time to come, "passed" for one gone
    const s = t - Date.now() / 1000;
    if (s <= 0) return "passed";
    if (s < 3600) return "in " + Math.max(1, Math.round(s / 60)) + "m";
    return s < 86400 ? "in " + (s / 3600).toFixed(1) + "h" : "in " + (s / 86400).toFixed(1) + "d";
  }
  function say(text) { statusLine.textContent = text; }

  class HttpError extends Error {
    constructor(status, body) { super(body.error || ("HTTP " + status)); this.status = status; this.body = body; }
  }

  // to the login, which comes back to this page once logged in
  function toLogin() { location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search)); }

  async function get(url) {
    let r;
    try { r = await fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } }); }
    catch (e) { throw new HttpError(0, { error: "no answer from the console" }); }  // (status 0: none came)
    const body = await r.json().catch(() => ({}));
    if (r.status === 401) { toLogin(); throw new HttpError(r.status, body); }
    if (!r.ok) throw new HttpError(r.status, body);
    return body;
  }

  // A changing request, with the session's CSRF token. That token is an HMAC with a key the daemon makes at each
  // start: a page left open across a restart holds one the console now refuses, before it does anything. It is
  // read again (/api/session) and the request sent once more; a session now of someone else (a login in another
  // tab) reloads the page instead, which then says who is logged in.
  async function send(url) {
    const once = () => fetch(url, { method: "POST", credentials: "same-origin",
                                    headers: { "X-CSRF-Token": session ? session.csrf : "" } });
    const r = await once();
    if (r.status !== 403 || !session) return r;
    const body = await r.clone().json().catch(() => ({}));
    if (body.field !== "X-CSRF-Token") return r;
    const now = await get("/api/session");
    if (now.name !== session.name) { location.reload(); throw new HttpError(r.status, body); }
    session = now;
    return once();
  }

  async function post(url) {
    const r = await send(url);
    const body = await r.json().catch(() => ({}));
    // no session any more (it expired, or was logged out in another tab): to the login, as a read goes
    if (r.status === 401) { toLogin(); throw new HttpError(r.status, body); }
    if (!r.ok) throw new HttpError(r.status, body);
    return body;
  }

  // An error of a view already left (a refresh in flight when its job was deleted from its own page) is not shown:
  // it would replace the view now on the page. Nor is a 401: the page is on its way to the login (get's toLogin),
  // and "Something went wrong" flashed over the view until the login came.
  function showError(e, mine) {
    if (mine !== undefined && mine !== viewNumber) return;
    if (e.status === 401) return;
    main.replaceChildren(h("h1", {}, "Something went wrong"), h("p", { class: "error", role: "alert" }, e.message));
  }

  // A view re-read on a change (its event stream's) that gets no answer or a 503, the daemon restarting, keeps
  // what it shows, saying so: replaced by the error, it took with it what lives on in it (a log being followed),
  // and the stream, once back, brings a read that answers. Any other error is shown.
  function refreshFailed(e, mine) {
    if (mine !== viewNumber) return;
    if (e.status === 0 || e.status === 503) say(e.message + " (the daemon restarting?); the page is as it was");
    else showError(e, mine);
  }

  // A view's live updates, opened once its first answer is shown: `mine`, the view's number, since a view left
  // while it loaded must not open its stream then (one stream a page: it would close the stream of the view shown).
  function watch(mine, query, onMessage) {
    if (mine !== viewNumber) return;
    if (events) events.close();
    const es = new EventSource("/api/events" + query);
    events = es;
    es.addEventListener("jobs", (ev) => onMessage(JSON.parse(ev.data)));
    es.addEventListener("open", () => say("live"));
    es.addEventListener("error", () => {
      if (es.readyState !== EventSource.CLOSED) { say("reconnecting…"); return; }
      // refused (an error status: the console's streams all taken, the daemon away, or no session any more: a
      // logout, an expiry, a token revoked, each of which ends the stream), and the browser does not retry that on
      // its own: without a session the page goes to the login now (get does), else the view is shown afresh
      // (read again, watched again) a little later
      say("live updates paused; retrying…");
      get("/api/session").catch(() => {});
      setTimeout(() => { if (mine === viewNumber && events === es) route(); }, WATCH_RETRY_MS);
    });
  }

  // The cluster, queue, pools and hosts views show what changes with no job changing (a host drained, down or
  // unhealthy, hosts kept for a waiting gang, a gang's expected start): besides their re-read on job changes they
  // are read again every STATE_POLL_MS while shown (`refresh`: the view's debounced re-read).
  const STATE_POLL_MS = 5000;
  function watchState(mine, refresh) {
    watch(mine, "", refresh);
    const tick = () => { if (mine !== viewNumber) return; refresh(); setTimeout(tick, STATE_POLL_MS); };
    setTimeout(tick, STATE_POLL_MS);
  }

  // A view's answer that comes after the view was left (a click on another view while it loaded) is not shown:
  // it would replace the view now on the page.
  function paint(mine, ...nodes) { if (mine === viewNumber) main.replaceChildren(...nodes); }

  // A view re-read on job changes (the queue, the hosts) keeps `kept` (its heading and filters) across its
  // re-renders, so what is typed in a filter and not yet submitted stays, with the keyboard's focus; the rest is
  // drawn again, and a control of it that had the focus (by its id) has it again.
  function paintKeeping(mine, kept, ...nodes) {
    if (mine !== viewNumber) return;
    const last = kept[kept.length - 1];
    if (last.parentNode !== main) { main.replaceChildren(...kept, ...nodes); return; }
    const f = document.activeElement;
    const focused = f && f.id && main.contains(f) && !kept.some((k) => k.contains(f)) ? f.id : null;
    while (last.nextSibling) last.nextSibling.remove();
    last.after(...nodes);
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
  }

  // Each view shown has its number: a refresh that was due for a view left meanwhile does nothing (it would
  // read, say, a job just deleted from its own page).
  let viewNumber = 0;
  function debounce(mine, fn, ms) {
    let t = null;
    return () => { if (t) return; t = setTimeout(() => { t = null; if (mine === viewNumber) fn(); }, ms); };
  }

  // A view shown anew by one of its own controls (a filter's submit, a page of the hosts): the control of that id
  // has the keyboard's focus again in the view drawn anew (it fell to the document's start: Tab went back to the
  // skip link), or the view, where that control is gone or off.
  function reroute(url, state) {
    const f = document.activeElement;
    const focused = f && f.id && main.contains(f) ? f.id : "";
    history.pushState(state || null, "", url);
    const shown = route();
    const mine = viewNumber;
    return shown.then(() => {
      if (mine !== viewNumber) return;
      const el = focused && document.getElementById(focused);
      if (el && !el.disabled) el.focus(); else main.focus();
    });
  }

  // ---- the cluster

  async function cluster() {
    const mine = viewNumber;
    document.title = "Cluster · Peloton";
    const render = async () => {
      const c = await get("/api/cluster");
      const meters = ["gpu", "cpu", "mem_mib"].map((k) => {
        const cap = c.capacity[k], used = c.allocated[k];
        const pct = cap ? Math.round(100 * used / cap) : 0;
        const label = { gpu: "GPUs", cpu: "CPUs", mem_mib: "Memory (MiB)" }[k];
        return h("div", { class: "card" }, h("div", { class: "muted" }, label),
          h("div", { class: "big" }, fmt(used), h("span", { class: "muted" }, " / " + fmt(cap))),
          h("div", { class: "meter", role: "meter", "aria-label": label + " allocated", "aria-valuemin": 0,
                     "aria-valuemax": cap, "aria-valuenow": used }, h("span", { style: null, "data-pct": pct })),
          h("div", { class: "muted" }, pct + "% allocated"));
      });
      const hostStates = Object.entries(c.host_states).sort().map(([k, v]) => h("li", {}, stateBadge(k), " ", v));
      const gpuStates = ["used", "free", "stranded", "reserved", "draining", "drained", "unhealthy", "down"]
        .filter((k) => c.gpus[k]).map((k) => h("li", { "data-gpus": k }, h("span", { class: "gpu " + k }), " " + GPU_WORDS[k] + " ", c.gpus[k]));
      const gangStates = Object.entries(c.gang_states).sort().map(([k, v]) => h("li", { "data-gangs": k }, stateBadge(k), " ", v));
      const secs = (x) => x < 1 ? Math.round(x * 1000) + " ms" : x < 120 ? x.toFixed(1) + " s" : (x / 60).toFixed(1) + " min";
      const STAGE_WORDS = { queued: "queued (enqueued → admitted)", placing: "placing (admitted → placed)",
        launched: "launched (launch → started by the backend)", launching: "launching (launch → every member running)",
        submitted_to_running: "submitted → running" };
      paint(mine,
        h("h1", {}, "Cluster"),
        h("div", { class: "cards" },
          h("div", { class: "card" }, h("div", { class: "muted" }, "Hosts"), h("div", { class: "big" }, c.hosts),
            h("ul", { class: "muted", "aria-label": "Hosts by state" }, hostStates)),
          h("div", { class: "card" }, h("div", { class: "muted" }, "Gangs waiting"),
            h("div", { class: "big" }, c.queued_gangs), h("a", { href: "/queue" }, "The queue")),
          meters,
          h("div", { class: "card", id: "gpu-states" }, h("div", { class: "muted" }, "GPUs by state"),
            h("ul", { class: "plain", "aria-label": "GPUs by state" }, gpuStates.length ? gpuStates : h("li", { class: "muted" }, "no GPUs")),
            h("a", { href: "/hosts" }, "The hosts map")),
          h("div", { class: "card", id: "gang-states" }, h("div", { class: "muted" }, "Gangs by state"),
            h("ul", { class: "plain", "aria-label": "Gangs by state" }, gangStates.length ? gangStates : h("li", { class: "muted" }, "no gangs"))),
          h("div", { class: "card" }, h("div", { class: "muted" }, "Daemon"),
            h("dl", { class: "facts" }, h("dt", {}, "backend"), h("dd", {}, c.backend),
              h("dt", {}, "version"), h("dd", {}, c.version), h("dt", {}, "up since"), h("dd", {}, ago(c.started_at))))),
        h("h2", {}, "Gang stage latencies"),
        h("p", { class: "muted" }, "How long gangs spent in each stage since the daemon started (estimated from the " +
          "histogram peloton_gang_stage_seconds)."),
        h("table", { "aria-label": "Gang stage latencies", id: "stages" },
          h("thead", {}, h("tr", {}, ["Stage", "Gangs", "Mean", "p50", "p95", "p99"].map((x) => h("th", { scope: "col" }, x)))),
          h("tbody", {}, c.stages.map((g) => h("tr", { "data-stage": g.stage }, h("td", {}, STAGE_WORDS[g.stage] || g.stage),
            h("td", {}, g.count), g.count ? [h("td", {}, secs(g.mean_s)), h("td", {}, secs(g.p50_s)), h("td", {}, secs(g.p95_s)),
            h("td", {}, secs(g.p99_s))] : h("td", { colspan: 4, class: "muted" }, "none yet"))))),
        h("h2", {}, "Pools"),
        h("table", { "aria-label": "Pools" },
          h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Pool"), h("th", { scope: "col" }, "GPUs allocated"),
            h("th", { scope: "col" }, "GPUs wanted by waiting gangs"), h("th", { scope: "col" }, "Gangs waiting"))),
          h("tbody", {}, c.pools.map((p) => h("tr", {},
            h("td", {}, h("a", { href: "/jobs?pool=" + encodeURIComponent(p.path) }, p.path)),
            h("td", {}, fmt(p.allocated.gpu)), h("td", {}, fmt(p.demand.gpu)), h("td", {}, p.queued_gangs))))));
      // widths through the CSS object model: the policy allows no inline style attributes
      for (const s of main.querySelectorAll(".meter > span")) s.style.width = s.dataset.pct + "%";
    };
    await render();
    watchState(mine, debounce(mine, () => render().catch((e) => refreshFailed(e, mine)), SLOW_REFRESH_MS));
  }

  // ---- the jobs list

  async function jobs() {
    const mine = viewNumber;
    document.title = "Jobs · Peloton";
    const params = new URLSearchParams(location.search);
    // the page shown is in the address (page_token) and the page tokens of the pages before it (for Previous) in
    // its history entry, as the hosts map's: Back, Forward and a reload show the page they were on (a link to a
    // page past the first, without its history, goes back to the first)
    const shown = params.get("page_token") || "";
    const before = (history.state && history.state.jobPages) || (shown ? [""] : []);
    const tokens = [...before, shown];
    let rows = new Map();
    const form = h("form", { class: "filters", role: "search", "aria-label": "Filter jobs" },
      h("div", {}, h("label", { for: "f-state" }, "State"),
        h("select", { id: "f-state", name: "state" }, h("option", { value: "" }, "any"),
          STATES.map((s) => h("option", { value: s, selected: params.get("state") === s }, s)))),
      h("div", {}, h("label", { for: "f-owner" }, "Owner"),
        h("input", { id: "f-owner", name: "owner", value: params.get("owner") || "", size: 12 })),
      h("div", {}, h("label", { for: "f-pool" }, "Pool"),
        h("input", { id: "f-pool", name: "pool", value: params.get("pool") || "", size: 14, placeholder: "/" })),
      h("div", {}, h("label", { for: "f-q" }, "Name contains"),
        h("input", { id: "f-q", name: "q", value: params.get("q") || "", size: 16 })),
      h("button", { type: "submit" }, "Filter"));
    const tbody = h("tbody", { id: "jobs-body" });
    const prev = h("button", { type: "button", id: "prev", disabled: true }, "Previous page");
    const next = h("button", { type: "button", id: "next", disabled: true }, "Next page");
    const count = h("span", { class: "muted", "aria-live": "polite" });
    const error = h("p", { class: "error", role: "alert" });
    main.replaceChildren(h("h1", {}, "Jobs"), form, error,
      h("table", { "aria-label": "Jobs" },
        h("thead", {}, h("tr", {}, ["Job", "Name", "Owner", "Pool", "State", "Tasks", "Why", "Created"].map(
          (c) => h("th", { scope: "col" }, c)))), tbody),
      h("div", { class: "pager" }, prev, next, count));

    function row(j) {
      const tasks = Object.entries(j.task_states).map(([s, n]) => n + " " + s.toLowerCase()).join(", ");
      return h("tr", { "data-job": j.id },
        h("td", {}, h("a", { href: "/jobs/" + j.id }, j.id)), h("td", {}, j.name), h("td", {}, j.owner),
        h("td", {}, j.pool), h("td", { class: "st" }, stateBadge(j.state)), h("td", {}, tasks),
        h("td", { class: "reason" }, why(j)), h("td", {}, ago(j.created_at)));
    }

    function why(j) {
      const w = j.waiting;
      if (!w) return j.reason;
      return "#" + w.position + " in " + w.pool + ", waiting " + ago(w.since).replace(" ago", "") +
        (w.reason ? ": " + w.reason : " (" + w.state + ")");
    }

    function query(token) {
      const q = new URLSearchParams();
      for (const k of ["state", "owner", "pool", "q"]) if (params.get(k)) q.set(k, params.get(k));
      q.set("page_size", "50");
      if (token) q.set("page_token", token);
      return "/api/jobs?" + q.toString();
    }

    // Reads overlap (a change's re-read, Next): only the answer of the newest read sent is shown, whichever comes
    // last (an older one answered last showed the list as it was before, a stopped job RUNNING again).
    let reads = 0;
    let turning = false;  // a page asked for (Next, Previous) and not shown yet
    async function load() {
      const me = ++reads;
      let page;
      try { page = await get(query(tokens[tokens.length - 1])); }
      catch (e) {
        if (me !== reads) return;
        turning = false;
        if (e.status !== 401) error.textContent = e.message;
        return;
      }
      if (me !== reads) return;
      turning = false;
      error.textContent = "";
      rows = new Map(page.jobs.map((j) => [j.id, j]));
      tbody.replaceChildren(...page.jobs.map(row));
      if (!page.jobs.length) tbody.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No jobs match.")));
      // a button turned off with the focus on it loses it (to the document's start): it goes to the other one
      const focused = document.activeElement;
      next.disabled = !page.next_page_token;
      next.dataset.token = page.next_page_token;
      prev.disabled = tokens.length === 1;
      const other = focused === next ? prev : next;
      if ((focused === next || focused === prev) && focused.disabled) (other.disabled ? main : other).focus();
      count.textContent = "page " + tokens.length + ", " + page.jobs.length + " jobs";
    }
    const reload = debounce(mine, load, 500);

    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v) q.set(k, String(v));
      reroute("/jobs" + (q.toString() ? "?" + q : ""));
    });
    // (a second click before the page asked for is shown moved on from the same page again: it does nothing)
    const turn = (change) => {
      if (turning) return;
      turning = true;
      change();
      const q = new URLSearchParams(location.search);
      const token = tokens[tokens.length - 1];
      if (token) q.set("page_token", token); else q.delete("page_token");
      history.pushState({ jobPages: tokens.slice(0, -1) }, "", "/jobs" + (q.toString() ? "?" + q : ""));
      load();
    };
    next.addEventListener("click", () => turn(() => tokens.push(next.dataset.token)));
    prev.addEventListener("click", () => turn(() => tokens.pop()));
    await load();
    watch(mine, "", (m) => {
      if (m.resync) { reload(); return; }
      for (const c of m.changes) {
        const j = rows.get(c.job_id);
        if (!j) { if (tokens.length === 1) reload(); continue; }  // a new job, or one this page does not show
        if (c.deleted || (params.get("state") && c.state !== params.get("state"))) { reload(); continue; }
        j.state = c.state; j.reason = c.reason;
        if (c.state !== "PENDING") j.waiting = null;
        const tr = tbody.querySelector('tr[data-job="' + c.job_id + '"]');
        if (tr) { tr.querySelector(".st").replaceChildren(stateBadge(c.state)); tr.querySelector(".reason").textContent = why(j); }
        reload();  // the task counts too
      }
    });
  }

  // ---- one job

  function mayStop(j) {
    if (!session || TERMINAL.has(j.state) || j.desired_state === "KILLED") return false;
    return session.may_control_any || (session.may_control_own && j.owner === session.name);
  }

  function mayDelete(j) {
    if (!session || !TERMINAL.has(j.state)) return false;
    return session.may_control_any || (session.may_control_own && j.owner === session.name);
  }

  // A bar of timeline segments on a window [t0, t0 + span] shared by every bar drawn together.
  function segmentBar(label, segs, t0, span) {
    const bar = h("div", { class: "timeline", role: "img", "aria-label": label + ": " +
      (segs.map((g) => g.state + " (run " + g.run + ")").join(", ") || "no state changes") });
    for (const g of segs) {
      const seg = h("span", { class: "seg " + g.state, title: g.state + ", run " + g.run + (g.host ? " on " + g.host : "") +
        ", " + fmt(g.end - g.start) + "s" + (g.reason ? ": " + g.reason : "") }, g.end > g.start ? g.state : "");
      seg.dataset.left = String(100 * (g.start - t0) / span);
      seg.dataset.width = String(Math.max(0.4, 100 * (g.end - g.start) / span));
      bar.append(seg);
    }
    return bar;
  }
  // widths through the CSS object model: the policy allows no inline style attributes
  function placeSegments(root) {
    for (const seg of root.querySelectorAll(".timeline .seg")) {
      seg.style.left = seg.dataset.left + "%"; seg.style.width = seg.dataset.width + "%";
    }
  }
  function seconds(x) { return x >= 1 ? x.toFixed(2) + " s" : (1000 * x).toFixed(1) + " ms"; }

  async function job(id) {
    document.title = "Job " + id + " · Peloton";
    const expanded = new Set();  // the members whose timeline is open (kept open across re-renders)
    const gangsOpen = new Set();  // the gangs whose members' timeline is open
    const mine = viewNumber;

    function gangButton(g) {
      const b = h("button", { type: "button", class: "small", id: "gtl-" + g, "aria-expanded": "false",
                              "aria-controls": "gang-timeline-" + g, "aria-label": "Timeline of every member of gang " + g },
        "Timeline");
      b.addEventListener("click", async () => {
        if (gangsOpen.has(g)) {
          gangsOpen.delete(g);
          const row = document.getElementById("gang-timeline-" + g);
          if (row) row.remove();
          b.setAttribute("aria-expanded", "false");
        } else {
          gangsOpen.add(g);
          await showGangTimeline(g);
        }
      });
      return b;
    }

    // every member of the gang side by side, on one time axis: one request (one ListTaskEvents behind it)
    async function showGangTimeline(g) {
      if (!main.querySelector('tr[data-gang="' + g + '"]')) return;
      const t = await get("/api/jobs/" + id + "/gangs/" + g + "/timeline");
      // drawn where it was asked for, found again now: on this job's page still shown (not under the gang of that
      // index of another job's page shown meanwhile), while the timeline is still open
      const tr = mine === viewNumber && gangsOpen.has(g) && main.querySelector('tr[data-gang="' + g + '"]');
      if (!tr) return;
      const old = document.getElementById("gang-timeline-" + g);
      if (old) old.remove();
      const all = t.members.flatMap((m) => m.segments);
      const t0 = all.length ? Math.min(...all.map((x) => x.start)) : t.now;
      const t1 = Math.max(t.now, ...all.map((x) => x.end));
      const span = Math.max(t1 - t0, 0.001);
      const rows = h("div", { class: "gang-timeline" }, t.members.map((m) => h("div", { class: "gt-row" },
        h("span", { class: "gt-label" }, "member " + m.instance),
        segmentBar("Member " + m.instance, m.segments, t0, span))));
      const note = "Gang " + g + ": " + t.members.length + " of " + t.members_total + " members, " + t.events_total +
        " state changes" + (t.since ? ", those since " + new Date(t.since * 1000).toLocaleTimeString() + " shown" : "") +
        "; from " + new Date(t0 * 1000).toLocaleTimeString() + " to " + new Date(t1 * 1000).toLocaleTimeString() + ".";
      const row = h("tr", { id: "gang-timeline-" + g, class: "timeline-row" },
        h("td", { colspan: 8 }, h("div", { class: "muted" }, note), rows));
      tr.after(row);
      placeSegments(row);
      const b = document.getElementById("gtl-" + g);
      if (b) b.setAttribute("aria-expanded", "true");
    }

    // ---- logs, followed: read the tail, then from next_offset every second until the run has ended and
    // nothing more came. The panel is built once and kept across re-renders (its text and its follow).
    const logs = (() => {
      const member = h("input", { id: "log-member", name: "member", type: "number", min: 0, value: 0, size: 6 });
      const stream = h("select", { id: "log-stream", name: "stream" },
        h("option", { value: "stdout" }, "stdout"), h("option", { value: "stderr" }, "stderr"));
      const follow = h("input", { id: "log-follow", name: "follow", type: "checkbox", checked: true });
      const out = h("pre", { id: "log-text", class: "log", tabindex: 0, "aria-label": "Log" });
      const state = h("p", { id: "log-state", class: "muted", "aria-live": "polite" });
      const form = h("form", { class: "filters", "aria-label": "Show a member's log" },
        h("div", {}, h("label", { for: "log-member" }, "Member (instance)"), member),
        h("div", {}, h("label", { for: "log-stream" }, "Stream"), stream),
        h("div", {}, h("label", { for: "log-follow" }, "Follow"), follow),
        h("button", { type: "submit", id: "log-show" }, "Show log"));
      let reading = 0;  // each Show starts a new read; an older one stops
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const me = ++reading;
        const base = "/api/jobs/" + id + "/members/" + encodeURIComponent(member.value) + "/logs?stream=" + stream.value;
        out.textContent = "";
        state.textContent = "reading…";
        let r;
        // an answer of a read that an older Show began is dropped (it came last: it wrote the member asked for
        // before into the panel that the newer one's follow then appended to)
        try { r = await get(base); }
        catch (e) { if (me === reading && e.status !== 401) state.textContent = e.message; return; }
        if (me !== reading || mine !== viewNumber) return;
        out.textContent = r.content;
        let offset = r.next_offset;
        // the follow stays on the run it began on, as `task logs -f` does: a gang restarted meanwhile has a new
        // run whose log the old run's offset means nothing in (the task id is <job>-<instance>-<run>)
        const run = r.task_id.slice(r.task_id.lastIndexOf("-") + 1);
        const line = (x) => x.task_id + " (" + (x.task_state || "?") + ")";
        state.textContent = line(r) + (r.ended || !follow.checked ? ", not following" : ", following…");
        if (r.ended || !follow.checked) return;
        while (me === reading && mine === viewNumber && follow.checked) {
          await new Promise((ok) => setTimeout(ok, 1000));
          if (me !== reading || mine !== viewNumber) return;
          try { r = await get(base + "&run=" + run + "&offset=" + offset); }
          catch (e) {
            if (me !== reading || mine !== viewNumber) return;
            // the daemon away (restarting: no answer, or 503): the follow goes on from the same offset once it is
            // back, as the event stream does (a member of the local backend runs on meanwhile: its log grows)
            if (e.status === 0 || e.status === 503) {
              state.textContent = line(r) + ", " + e.message + " (the daemon restarting?); retrying…";
              continue;
            }
            if (e.status !== 401) state.textContent = e.message;
            return;
          }
          if (me !== reading || mine !== viewNumber) return;
          if (r.content) { out.append(r.content); out.scrollTop = out.scrollHeight; }
          offset = r.next_offset;
          if (r.ended && !r.content) { state.textContent = line(r) + ", ended: not following"; return; }
          state.textContent = line(r) + ", following…";
        }
        if (me === reading) state.textContent = line(r) + ", not following";
      });
      return { el: h("section", { "aria-label": "Logs" }, h("h2", {}, "Logs"), form, state, out), member, form };
    })();

    function planTable(j) {
      const planned = j.gangs.filter((g) => g.plan);
      if (!planned.length) return null;
      return [h("h2", {}, "Plan (model-aware)"),
        h("table", { "aria-label": "Plans" },
          h("thead", {}, h("tr", {}, ["Gang", "GPUs per host", "Predicted step", "Predicted samples/s",
            "Measured step", "Measured samples/s", "Measured by", "Local batch", "Runner-ups"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, planned.map((g) => {
            const p = g.plan;
            const measured = p.measured_members > 0;
            // the daemon reads the members' speed only while the gang runs (as `job get` says)
            const none = ["DONE", "ABORTING", "PREEMPTING"].includes(g.state) ? "read only while the gang runs"
              : "not reported yet";
            return h("tr", { "data-plan": g.index }, h("td", {}, g.index), h("td", {}, p.gpus_per_host.join(" + ")),
              h("td", {}, seconds(p.step_time)), h("td", {}, fmt(p.samples_per_s)),
              h("td", {}, measured ? seconds(p.measured_step_time) : none),
              h("td", {}, measured ? fmt(p.measured_samples_per_s) + " (" +
                Math.round(100 * p.measured_samples_per_s / Math.max(p.samples_per_s, 1e-9)) + "% of predicted)" : "—"),
              h("td", {}, measured ? p.measured_members + " members" : "—"), h("td", {}, fmt(p.local_bsz)),
              h("td", {}, p.alternatives.map((a) => a.gpus_per_host.join("+") + ": " + fmt(a.samples_per_s) + "/s").join("; ") || "—"));
          })))];
    }

    async function eventsTable() {
      let r;
      try { r = await get("/api/jobs/" + id + "/events?limit=200"); }
      catch (e) { return h("p", { class: "error" }, e.message); }
      return [h("table", { class: "events", "aria-label": "Events" },
        h("thead", {}, h("tr", {}, ["When", "Member", "Run", "State", "Host", "Why"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, r.events.length ? r.events.map((e) => h("tr", {},
          h("td", {}, new Date(e.time * 1000).toLocaleTimeString()), h("td", {}, e.instance), h("td", {}, e.run),
          h("td", {}, stateBadge(e.state)), h("td", {}, e.host),
          h("td", { class: "reason" }, [e.reason, e.message].filter(Boolean).join(": ") +
            (e.exit_code !== null ? " (exit " + e.exit_code + ")" : "")))) :
          h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No state changes yet.")))),
        h("p", { class: "muted" }, r.total > r.events.length ? "The newest " + r.events.length + " of " + r.total + "."
          : r.total + " state changes.")];
    }

    function timelineButton(i) {
      const b = h("button", { type: "button", class: "small", id: "tl-" + i, "aria-expanded": "false",
                              "aria-controls": "timeline-" + i, "aria-label": "Timeline of member " + i }, String(i));
      b.addEventListener("click", async () => {
        if (expanded.has(i)) {
          expanded.delete(i);
          const row = document.getElementById("timeline-" + i);
          if (row) row.remove();
          b.setAttribute("aria-expanded", "false");
        } else {
          expanded.add(i);
          await showTimeline(i);
        }
      });
      return b;
    }

    async function showTimeline(i) {
      if (!main.querySelector('tr[data-member="' + i + '"]')) return;
      const m = await get("/api/jobs/" + id + "/members/" + i);
      const tr = mine === viewNumber && expanded.has(i) && main.querySelector('tr[data-member="' + i + '"]');  // (as above)
      if (!tr) return;
      const old = document.getElementById("timeline-" + i);
      if (old) old.remove();
      const segs = m.segments;
      const t0 = segs.length ? segs[0].start : m.now;
      const t1 = Math.max(m.now, ...segs.map((g) => g.end));
      const span = Math.max(t1 - t0, 0.001);
      const bar = segmentBar("Member " + i, segs, t0, span);
      const list = h("table", { class: "events", "aria-label": "State changes of member " + i },
        h("thead", {}, h("tr", {}, ["When", "Run", "State", "Host", "For", "Why"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, segs.map((g) => h("tr", {}, h("td", {}, new Date(g.start * 1000).toLocaleTimeString()),
          h("td", {}, g.run), h("td", {}, stateBadge(g.state)), h("td", {}, g.host),
          h("td", {}, g.end > g.start ? fmt(g.end - g.start) + "s" : ""), h("td", { class: "reason" }, g.reason)))));
      const row = h("tr", { id: "timeline-" + i, class: "timeline-row" },
        h("td", { colspan: 7 }, h("div", { class: "muted" }, "Member " + i + " (" + m.task_id + "), " +
          m.events_total + " state changes" + (m.events_total > segs.length ? ", the newest " + segs.length + " shown" : "")),
          bar, list));
      tr.after(row);
      placeSegments(row);
      const b = document.getElementById("tl-" + i);
      if (b) b.setAttribute("aria-expanded", "true");
    }

    // `again`: a re-render on a change (its failure keeps the page: refreshFailed); the first one's failure is
    // route's to show (and, the daemon away, to ask again)
    const render = async (again) => {
      let j, eventList;
      try { [j, eventList] = await Promise.all([get("/api/jobs/" + id), eventsTable()]); }
      catch (e) { if (!again) throw e; refreshFailed(e, mine); return false; }
      if (mine !== viewNumber) return false;  // left meanwhile: nothing of this page is drawn any more
      const actions = h("div", { class: "actions" });
      if (mayStop(j)) {
        const stop = h("button", { type: "button", class: "danger", id: "stop" }, "Stop job");
        stop.addEventListener("click", async () => {
          if (!confirm("Stop job " + j.id + " (" + j.name + ")? Every member is killed.")) return;
          // the button turned off, and then gone from the page re-rendered, took the keyboard's focus to the
          // document's start: it goes to the job's state, which says what the stop does as it does it (kept
          // there across re-renders, by its id); back to the button if the stop is refused
          const st = document.getElementById("job-state");
          if (st) st.focus();
          stop.disabled = true;
          try { await post("/api/jobs/" + j.id + "/stop"); say("stop requested"); }
          catch (e) {
            say(e.message);
            stop.disabled = false;
            const again = document.getElementById("stop");  // (this one, or the one of the page re-rendered meanwhile)
            if (again && document.activeElement && document.activeElement.id === "job-state") again.focus();
          }
        });
        actions.append(stop);
      }
      if (mayDelete(j)) {
        const del = h("button", { type: "button", class: "danger", id: "delete" }, "Delete job");
        del.addEventListener("click", async () => {
          if (!confirm("Delete job " + j.id + " (" + j.name + ") and its records? This cannot be undone.")) return;
          del.disabled = true;
          try {
            await post("/api/jobs/" + j.id + "/delete");
            // to the jobs list from this job's page (or its "deleted" note), not from a view clicked meanwhile
            if (location.pathname === "/jobs/" + j.id) reroute("/jobs");
          } catch (e) { say(e.message); del.disabled = false; }
        });
        actions.append(del);
      }
      // (replaceChildren would write a null or an array as text: the parts that may be absent or many are flattened)
      paint(mine, ...[
        h("p", {}, h("a", { href: "/jobs" }, "← Jobs")),
        h("h1", {}, "Job ", j.id, " ", j.name ? "(" + j.name + ") " : "", h("span", { id: "job-state", tabindex: -1 }, stateBadge(j.state))),
        actions,
        h("div", { class: "card" }, h("dl", { class: "facts" },
          h("dt", {}, "Why"), h("dd", { id: "job-reason" }, j.reason || (j.gangs.find((g) => g.reason) || {}).reason || "—"),
          h("dt", {}, "Owner"), h("dd", {}, j.owner), h("dt", {}, "Pool"), h("dd", {}, j.pool),
          h("dt", {}, "Created"), h("dd", {}, ago(j.created_at)),
          h("dt", {}, "Runs as"), h("dd", {}, j.run_as || "the backend's default user"),
          h("dt", {}, "Gangs"), h("dd", {}, j.gang_count + " (" + Object.entries(j.gang_states).map(([s, n]) => n + " " + s).join(", ") + ")"))),
        h("h2", {}, "Gangs"),
        h("table", { "aria-label": "Gangs" },
          h("thead", {}, h("tr", {}, ["Gang", "Members", "State", "Attempt", "Run", "Preemptions", "Why", "Members' states"].map(
            (c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, j.gangs.map((g) => h("tr", { "data-gang": g.index }, h("td", {}, g.index), h("td", {}, g.instances),
            h("td", {}, stateBadge(g.state)), h("td", {}, g.attempt), h("td", {}, g.run), h("td", {}, g.preemptions),
            h("td", { class: "reason" }, g.reason), h("td", {}, gangButton(g.index)))))),
        planTable(j),
        h("h2", {}, "Members"),
        h("table", { "aria-label": "Members" },
          h("thead", {}, h("tr", {}, ["Instance (timeline)", "Gang", "State", "Host", "GPUs", "Run", "Why"].map(
            (c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, j.members.map((t) => h("tr", { "data-member": t.instance }, h("td", {}, timelineButton(t.instance)), h("td", {}, t.gang),
            h("td", {}, stateBadge(t.state)), h("td", {}, t.host), h("td", {}, t.gpus.join(",")), h("td", {}, t.run),
            h("td", { class: "reason" }, [t.reason, t.message].filter(Boolean).join(": ")))))),
        j.members_more ? h("p", { class: "muted" }, "The first 1000 members are shown.") : null,
        h("h2", {}, "Events"), eventList, logs.el].flat().filter((x) => x !== null && x !== undefined));
      placeSegments(main);
      return true;
    };
    await render();
    for (const i of expanded) await showTimeline(i);
    for (const g of gangsOpen) await showGangTimeline(g);
    // a re-render keeps the keyboard's place: the focused control (by id) has the focus again
    const rerender = async () => {
      const focused = document.activeElement && document.activeElement.id;
      if (!await render(true)) return;
      for (const i of expanded) await showTimeline(i);
      for (const g of gangsOpen) await showGangTimeline(g);
      if (mine === viewNumber && focused && document.getElementById(focused)) document.getElementById(focused).focus();
    };
    const refresh = debounce(mine, rerender, 300);
    watch(mine, "?job=" + encodeURIComponent(id), (m) => {
      if (m.changes.some((c) => c.job_id === id && c.deleted)) {
        if (events) { events.close(); events = null; }
        viewNumber += 1;  // nothing more to refresh here
        main.replaceChildren(h("p", {}, h("a", { href: "/jobs" }, "← Jobs")),
          h("h1", {}, "Job " + id), h("p", { role: "status" }, "This job was deleted."));
        return;
      }
      refresh();
    });
  }

  // ---- the queue

  // the hosts a head-of-line gang holds: the first few named, all of them in the title
  function reservedHosts(names) {
    if (!names.length) return "—";
    const shown = names.slice(0, 6);
    return h("span", { title: names.join(", ") }, shown.join(", "), names.length > shown.length ? " and " +
      (names.length - shown.length) + " more" : "", " (" + names.length + ")");
  }
  // when the held hosts are expected to free, and what that rests on
  function expectedStart(g) {
    if (!g.expected_start_basis) return "—";
    if (g.expected_start_basis === "max_runtime" && g.expected_start) {
      const s = Math.max(0, g.expected_start - Date.now() / 1000);
      return h("span", { title: "the end of the last gang on the held hosts, by its sla.max_runtime" },
        (s < 1 ? "now" : "in " + ago(Date.now() / 1000 - s).replace(" ago", "")) + " (" +
        new Date(g.expected_start * 1000).toLocaleTimeString() + ", by the max_runtime of the gangs there)");
    }
    if (g.expected_start_basis === "preemption") return "unknown (gangs there are being preempted for it)";
    return "unknown (a gang there has no max_runtime)";
  }

  async function queue() {
    const mine = viewNumber;
    document.title = "Queue · Peloton";
    const params = new URLSearchParams(location.search);
    const form = h("form", { class: "filters", role: "search", "aria-label": "Filter the queue" },
      h("div", {}, h("label", { for: "q-pool" }, "Pool (and its subtree)"),
        h("input", { id: "q-pool", name: "pool", value: params.get("pool") || "", size: 16, placeholder: "/" })),
      h("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = new FormData(form).get("pool");
      reroute("/queue" + (v ? "?pool=" + encodeURIComponent(String(v)) : ""));
    });
    const head = [h("h1", {}, "Queue"),
      h("p", { class: "muted" }, "The gangs waiting for admission or placement, first in queue order first (by " +
        "priority, then submission), and why each waits. A gang first in its pool that no hosts fit holds hosts " +
        "(nothing else starts there but gangs that end before it may start) until they free up."), form];
    const render = async () => {
      const q = new URLSearchParams();
      if (params.get("pool")) q.set("pool", params.get("pool"));
      const r = await get("/api/queue?" + q.toString());
      const res = (x) => [x.gpu ? fmt(x.gpu) + " GPU" : "", fmt(x.cpu) + " CPU", fmt(x.mem_mib / 1024) + " GiB"]
        .filter(Boolean).join(", ");
      paintKeeping(mine, head,
        h("table", { "aria-label": "Queue" },
          h("thead", {}, h("tr", {}, ["Pool", "Position", "Job", "Gang", "Priority", "Members", "Resources",
                                      "Waiting", "State", "Hosts held for it", "Expected start", "Why"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, r.gangs.length ? r.gangs.map((g) => h("tr", { "data-gang": g.gang },
            h("td", {}, g.pool), h("td", {}, g.position), h("td", {}, h("a", { href: "/jobs/" + g.job_id }, g.job_id)),
            h("td", {}, g.gang.split("/")[1] + (g.attempt > 1 ? " (attempt " + g.attempt + ")" : "")),
            h("td", {}, g.priority), h("td", {}, g.members), h("td", {}, res(g.resources)),
            h("td", {}, ago(g.enqueued_at).replace(" ago", "")), h("td", {}, stateBadge(g.state)),
            h("td", { class: "reserved" }, reservedHosts(g.reserved_hosts)), h("td", { class: "starts" }, expectedStart(g)),
            h("td", { class: "reason" }, g.reason))) :
            h("tr", {}, h("td", { colspan: 12, class: "muted" }, "Nothing waits.")))),
        h("p", { class: "muted" }, r.total > r.gangs.length ? "The first " + r.gangs.length + " of " + r.total + " gangs."
          : r.total + " gangs waiting."));
    };
    await render();
    watchState(mine, debounce(mine, () => render().catch((e) => refreshFailed(e, mine)), SLOW_REFRESH_MS));
  }

  // ---- pools

  async function pools() {
    const mine = viewNumber;
    document.title = "Pools · Peloton";
    const render = async () => {
      const r = await get("/api/pools");
      const res = (x) => x ? fmt(x.gpu) + " GPU, " + fmt(x.cpu) + " CPU" : "none";
      // a limit's dimension that is 0 is no limit on it
      const limit = (x) => [x.gpu ? fmt(x.gpu) + " GPU" : "", x.cpu ? fmt(x.cpu) + " CPU" : "",
                            x.mem_mib ? fmt(x.mem_mib) + " MiB" : ""].filter(Boolean).join(", ") || "no limit";
      paint(mine, h("h1", {}, "Pools"),
        h("p", { class: "muted" }, "The tree of pools: what each is given (reservation, limit, share), what it may " +
          "use now (entitlement), what it uses (allocated) and what its waiting gangs want (demand). A pool " +
          "using more than its reservation borrows what its sibling pools lend (their idle elastic reservations, in " +
          "proportion), and past that capacity no sibling reserves."),
        h("table", { "aria-label": "Pools" },
          h("thead", {}, h("tr", {}, ["Pool", "Reservation", "Limit", "Share", "Entitlement", "Allocated", "Demand",
                                      "Gangs waiting", "Lends / borrows"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, r.pools.map((p) => {
            const loans = (xs) => xs.map((x) => fmt(x.gpus) + " " + x.pool).join(", ");
            const lending = [];
            if (p.borrows_from.length || p.borrows_unreserved > 0) {
              lending.push("borrows " + [loans(p.borrows_from) && "from " + loans(p.borrows_from),
                p.borrows_unreserved > 0 ? fmt(p.borrows_unreserved) + " unreserved" : ""].filter(Boolean).join("; ") + " (GPUs)");
            }
            if (p.lends_to.length) lending.push("lends to " + loans(p.lends_to) + " (GPUs)");
            return h("tr", { "data-pool": p.path },
              h("td", { class: "pool-name depth-" + Math.min(p.depth, 6) },
                h("a", { href: "/jobs?pool=" + encodeURIComponent(p.path) }, p.path)),
              h("td", {}, res(p.reservation), p.reservation_type === "static" ? " (static)" : ""),
              h("td", {}, p.limit ? limit(p.limit) : "no limit"), h("td", {}, fmt(p.share)),
              h("td", {}, fmt(p.entitlement.gpu) + " GPU, " + fmt(p.entitlement.cpu) + " CPU"),
              h("td", {}, res(p.allocated)), h("td", {}, res(p.demand)), h("td", {}, p.queued_gangs),
              h("td", { class: "lending" }, lending.length ? lending.join("; ") : "—"));
          }))));
    };
    await render();
    watchState(mine, debounce(mine, () => render().catch((e) => refreshFailed(e, mine)), SLOW_REFRESH_MS));
  }

  // ---- hosts

  function mayOperate() { return session && session.permissions.includes("host.operate"); }

  async function hosts() {
    const mine = viewNumber;
    document.title = "Hosts · Peloton";
    const params = new URLSearchParams(location.search);
    const FILTERS = ["rack", "status", "free_gpus", "label", "q"];
    // the page tokens of the pages before this one (for Previous), in the history entry of the page: Back, Forward
    // and a reload find those of the page they show
    const before = (history.state && history.state.hostPages) || [];
    const rackSelect = h("select", { id: "h-rack", name: "rack" });
    let rackNames = null;  // the racks offered: the select is filled (again) when they change, its choice kept
    const form = h("form", { class: "filters", role: "search", "aria-label": "Filter hosts" },
      h("div", {}, h("label", { for: "h-rack" }, "Rack"), rackSelect),
      h("div", {}, h("label", { for: "h-status" }, "Status"),
        h("select", { id: "h-status", name: "status" }, h("option", { value: "" }, "any"),
          ["up", "draining", "drained", "unhealthy", "down"].map((x) => h("option", { value: x, selected: params.get("status") === x }, x)))),
      h("div", {}, h("label", { for: "h-free" }, "Free GPUs at least"),
        h("input", { id: "h-free", name: "free_gpus", type: "number", min: 0, max: 1024, size: 4,
                     value: params.get("free_gpus") || "" })),
      h("div", {}, h("label", { for: "h-label" }, "Label (key=value)"),
        h("input", { id: "h-label", name: "label", size: 14, value: params.get("label") || "" })),
      h("div", {}, h("label", { for: "h-q" }, "Name contains"),
        h("input", { id: "h-q", name: "q", size: 12, value: params.get("q") || "" })),
      h("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v) f.set(k, String(v));
      reroute("/hosts" + (f.toString() ? "?" + f : ""));
    });
    const head = [h("h1", {}, "Hosts"), form];
    const render = async () => {
      const q = new URLSearchParams();
      for (const k of [...FILTERS, "page_token"]) if (params.get(k)) q.set(k, params.get(k));
      const r = await get("/api/hosts?" + q.toString());
      if (mine !== viewNumber) return;
      const names = r.racks.filter((x) => x);
      if (rackNames === null || names.join("\n") !== rackNames.join("\n")) {
        const chosen = rackNames === null ? params.get("rack") || "" : rackSelect.value;
        rackSelect.replaceChildren(h("option", { value: "" }, "any"),
          names.map((x) => h("option", { value: x, selected: chosen === x }, x)));
        rackNames = names;
      }
      const racks = new Map();
      for (const x of r.hosts) { if (!racks.has(x.rack)) racks.set(x.rack, []); racks.get(x.rack).push(x); }
      const legend = h("p", { class: "legend", "aria-label": "Legend" },
        ["used", "free", "stranded", "reserved", "draining", "unhealthy"].map((k) =>
          h("span", { class: "key" }, h("span", { class: "gpu " + k }), " " + GPU_WORDS[k] + (k === "draining" ? ", drained or down" : ""))));
      const gpuWord = (g) => "GPU " + g.id + ": " + GPU_WORDS[g.state] + (g.job ? " by job " + g.job : "");
      const map = h("div", { class: "map" }, [...racks.entries()].map(([rack, hs]) => h("section", { class: "rack", "aria-label": "Rack " + (rack || "(none)") },
        h("h2", {}, "Rack " + (rack || "(none)")),
        h("ul", { class: "hostlist" }, hs.map((x) => {
          const cells = x.gpus.map((g) => h("span", { class: "gpu " + g.state, "data-gpu": g.id, "data-state": g.state,
                                                     "data-job": g.job || null, title: gpuWord(g) }));
          const counts = {};
          for (const g of x.gpus) counts[g.state] = (counts[g.state] || 0) + 1;
          const label = x.hostname + ": " + x.status + ", " + x.gpus.length + " GPUs: " +
            Object.entries(counts).map(([k, n]) => n + " " + GPU_WORDS[k]).join(", ") +
            (x.jobs.length ? "; jobs " + x.jobs.join(", ") : "") + (x.reserved_for ? "; kept for gang " + x.reserved_for : "") +
            (x.health ? " (" + x.health + ")" : "") +
            (x.status === "draining" && x.drain_deadline ? "; its gangs preempted " + until(x.drain_deadline) : "");
          const item = h("li", { class: "host " + x.status, "data-host": x.hostname, title: label },
            h("div", { class: "hostname" }, x.hostname, " ", x.status !== "up" ? stateBadge(x.status) : null),
            x.status === "draining" && x.drain_deadline ? h("div", { class: "muted drain-deadline" },
              "deadline " + until(x.drain_deadline)) : null,
            h("div", { class: "gpus", role: "img", "aria-label": label }, cells),
            x.reserved_for ? h("div", { class: "muted reserved-for" }, "kept for ",
              h("a", { href: "/jobs/" + x.reserved_for.split("/")[0] }, x.reserved_for)) : null,
            x.jobs.length ? h("div", { class: "muted jobs-on" }, x.jobs.slice(0, 3).map((j) => h("a", { href: "/jobs/" + j }, j)),
              x.jobs.length > 3 ? " +" + (x.jobs.length - 3) : "") : null);
          if (mayOperate() && !x.maintenance) {
            const undrain = x.status === "draining" || x.status === "drained";
            const b = h("button", { type: "button", class: "small", id: "drain-" + x.hostname,
                                    "aria-label": (undrain ? "Undrain " : "Drain ") + x.hostname },
              undrain ? "Undrain" : "Drain");
            b.addEventListener("click", async () => {
              // a drain asks for its deadline too (the CLI's --deadline): empty, the gangs there finish in their own time
              const deadline = undrain ? "" : prompt("Drain " + x.hostname + "? No new gangs go there. A deadline after " +
                "which the gangs still there are preempted (e.g. 30m, 2h), or empty for none:", "");
              if (deadline === null) return;
              b.disabled = true;
              const q = deadline.trim() ? "?deadline=" + encodeURIComponent(deadline.trim()) : "";
              try { await post("/api/hosts/" + encodeURIComponent(x.hostname) + (undrain ? "/undrain" : "/drain" + q)); await render(); }
              catch (e) { say(e.message); b.disabled = false; }
            });
            item.append(b);
          }
          return item;
        })))));
      const go = (token, pages) => {
        if (token) params.set("page_token", token); else params.delete("page_token");
        reroute("/hosts" + (params.toString() ? "?" + params : ""), { hostPages: pages });
      };
      const prev = h("button", { type: "button", id: "hosts-prev", disabled: !params.get("page_token") }, "Previous page");
      const next = h("button", { type: "button", id: "hosts-next", disabled: !r.next_page_token }, "Next page");
      prev.addEventListener("click", () => go(before[before.length - 1] || "", before.slice(0, -1)));
      next.addEventListener("click", () => go(r.next_page_token, [...before, params.get("page_token") || ""]));
      const page = before.length + 1;
      const pager = h("div", { class: "pager" }, prev, next,
        h("span", { class: "muted", "aria-live": "polite" }, r.total + " hosts" + (r.total > r.hosts.length ? ", page " + page +
          " (" + r.hosts.length + " shown)" : "")));
      paintKeeping(mine, head, legend, map,
        ...(r.hosts.length ? [] : [h("p", { class: "muted" }, "No host matches.")]), pager);
    };
    await render();
    watchState(mine, debounce(mine, () => render().catch((e) => refreshFailed(e, mine)), SLOW_REFRESH_MS));
  }

  // ---- the audit log (audit.read)

  async function audit() {
    const mine = viewNumber;
    document.title = "Audit · Peloton";
    const params = new URLSearchParams(location.search);
    const q = new URLSearchParams();
    for (const k of ["principal", "object", "denied", "before"]) if (params.get(k)) q.set(k, params.get(k));
    const r = await get("/api/audit?" + q.toString());
    const form = h("form", { class: "filters", role: "search", "aria-label": "Filter the audit log" },
      h("div", {}, h("label", { for: "a-principal" }, "Principal"),
        h("input", { id: "a-principal", name: "principal", value: params.get("principal") || "", size: 12 })),
      h("div", {}, h("label", { for: "a-object" }, "Object (job, pool, host)"),
        h("input", { id: "a-object", name: "object", value: params.get("object") || "", size: 16 })),
      h("div", {}, h("label", { for: "a-denied" }, "Calls"),
        h("select", { id: "a-denied", name: "denied" }, h("option", { value: "" }, "all"),
          h("option", { value: "1", selected: params.get("denied") === "1" }, "refused only"))),
      h("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v) f.set(k, String(v));
      reroute("/audit" + (f.toString() ? "?" + f : ""));
    });
    const older = h("button", { type: "button", id: "older", disabled: r.before === null }, "Older");
    older.addEventListener("click", () => {
      params.set("before", String(r.before));
      reroute("/audit?" + params);
    });
    paint(mine, h("h1", {}, "Audit log"), form,
      h("table", { "aria-label": "Audit log" },
        h("thead", {}, h("tr", {}, ["When", "Principal", "Via", "Call", "Object", "Outcome", "Message"].map(
          (c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, r.events.map((e) => h("tr", { "data-audit": e.id },
          h("td", {}, new Date(e.at * 1000).toLocaleString()), h("td", {}, e.principal), h("td", {}, e.via),
          h("td", {}, e.method), h("td", {}, e.object),
          h("td", {}, h("span", { class: "state " + (e.allowed ? "SUCCEEDED" : "FAILED") }, e.allowed ? "allowed" : "DENIED"),
            e.code && e.code !== "OK" ? " " + e.code : ""),
          h("td", { class: "reason" }, e.message))))),
      h("div", { class: "pager" }, older));
  }

  // ---- routing

  async function route() {
    viewNumber += 1;
    const mine = viewNumber;
    say("");
    if (events) { events.close(); events = null; }
    const path = location.pathname;
    for (const a of document.querySelectorAll("nav a")) {
      const v = a.dataset.view;
      const current = (v === "cluster" && path === "/") || (v !== "cluster" && (path === "/" + v || path.startsWith("/" + v + "/")));
      if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    }
    try {
      const m = path.match(/^\/jobs\/([0-9a-f]{12})$/);
      if (m) await job(m[1]);
      else if (path === "/jobs") await jobs();
      else if (path === "/queue") await queue();
      else if (path === "/audit") await audit();
      else if (path === "/pools") await pools();
      else if (path === "/hosts") await hosts();
      else await cluster();
    } catch (e) {
      if (e.status === 401) return;
      // the daemon away (restarting: no answer, or 503): the view has no event stream yet to bring it back, so it
      // is asked for again a little later, as a refused stream is
      const away = e.status === 0 || e.status === 503;
      showError(away ? new Error(e.message + " (the daemon restarting?); retrying…") : e, mine);
      if (away) setTimeout(() => { if (mine === viewNumber) route(); }, WATCH_RETRY_MS);
    }
  }

  document.addEventListener("click", (ev) => {
    const a = ev.target.closest && ev.target.closest("a[href^='/']");
    if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0 || a.getAttribute("href").startsWith("/assets/")) return;
    ev.preventDefault();
    history.pushState(null, "", a.getAttribute("href"));
    route().then(() => main.focus());
  });
  window.addEventListener("popstate", route);

  // to the login once the session has ended, not before (a refused logout went there with the session still open)
  document.getElementById("logout").addEventListener("click", async () => {
    try {
      const r = await send("/logout");
      if (r.ok || r.status === 401) { location.assign("/login"); return; }  // ended, or none left to end
      say("Not logged out: " + new HttpError(r.status, await r.json().catch(() => ({}))).message);
    } catch (e) { if (e.status !== 401) say("Not logged out: " + e.message); }
  });

  (async function start() {
    try { session = await get("/api/session"); }
    catch (e) {
      if (e.status === 401) return;
      const away = e.status === 0 || e.status === 503;  // (as route's)
      showError(away ? new Error(e.message + " (the daemon restarting?); retrying…") : e);
      if (away) setTimeout(start, WATCH_RETRY_MS);
      return;
    }
    document.getElementById("who").textContent = session.name + " (" + (session.roles.join(", ") || "no role") + ")";
    document.getElementById("logout").hidden = !session.authenticated;
    document.querySelector('nav a[data-view="audit"]').hidden = !session.permissions.includes("audit.read");
    await route();
  })();
})();
