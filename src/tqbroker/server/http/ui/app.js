// tqbroker's web UI: hash-routed pages over the management API (RabbitMQ's paths and JSON) and
// the topic API. Plain DOM, no dependencies; data is always inserted as text, never as HTML.
"use strict";

const KEY = "tqbroker.ui.";
const store = window.sessionStorage;
const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent; // the vhost "/" travels as %2F, as RabbitMQ's clients send it
let timer = null;
let rendering = 0;

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// ---- the API -------------------------------------------------------------------------------

async function api(method, path, { body, headers, raw } = {}) {
  const init = { method, credentials: "omit", headers: { Authorization: store.getItem(KEY + "auth") || "" } };
  Object.assign(init.headers, headers || {});
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    logout("Your credentials were refused: log in again.");
    throw new ApiError(401, "login refused");
  }
  if (raw) return response;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (e) {
    data = null;
  }
  if (!response.ok) {
    const why = data && (data.reason || data.message || data.error);
    throw new ApiError(response.status, `${method} ${path}: ${response.status} ${why || response.statusText}`);
  }
  return data;
}

const vhostPath = (vhost) => (vhost ? "/" + enc(vhost) : "");
const topicQuery = (vhost) => "?vhost=" + enc(vhost || "/");
const items = (data, key) => (Array.isArray(data) ? data : (data && (data[key] || data.items)) || []);

// ---- building the page ---------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// columns: [title, value(row), "num"?]; a value may be a Node.
function table(id, columns, rows, empty) {
  if (!rows.length) return h("p", { id, class: "muted" }, empty || "None.");
  const head = h("tr", {}, columns.map(([title, , kind]) => h("th", { class: kind }, title)));
  const body = rows.map((row) =>
    h("tr", { "data-name": row.name === undefined ? null : row.name }, columns.map(([, value, kind]) => h("td", { class: kind }, value(row)))),
  );
  return h("table", { id }, h("thead", {}, head), h("tbody", {}, body));
}

function card(title, pairs) {
  return h("div", { class: "card" }, h("h2", {}, title),
    h("dl", {}, pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
}

const num = (n) => (n === undefined || n === null ? "" : Number(n).toLocaleString("en-US"));
const rateOf = (stats, key) => (stats && stats[key + "_details"] ? stats[key + "_details"].rate : undefined);
const rate = (stats, key) => {
  const r = rateOf(stats, key);
  return r === undefined ? "" : `${Number(r).toFixed(1)}/s`;
};
function bytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
const flags = (o) => [o.durable && "D", o.auto_delete && "AD", o.exclusive && "Excl", o.internal && "I"].filter(Boolean).join(" ");
const args = (a) => (a && Object.keys(a).length ? JSON.stringify(a) : "");

function flash(message, isError) {
  const node = $("flash");
  node.textContent = message;
  node.className = isError ? "error" : "";
  node.hidden = !message;
}

// A modal confirmation; resolves to null (cancelled) or the reason typed (or "").
function confirmAction(title, text, reason) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-reason-label").hidden = reason === undefined;
  $("confirm-reason").value = reason || "";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" ? $("confirm-reason").value : null), { once: true });
    dialog.showModal();
  });
}

async function act(title, text, reason, action, done) {
  const answer = await confirmAction(title, text, reason);
  if (answer === null) return;
  try {
    await action(answer);
    flash(done);
  } catch (e) {
    flash(e.message, true);
  }
  render();
}

// ---- pages ---------------------------------------------------------------------------------

async function overviewPage() {
  const overview = await api("GET", "api/overview");
  const alarmsResponse = await api("GET", "api/health/checks/alarms", { raw: true });
  const alarms = alarmsResponse.status === 503 ? (await alarmsResponse.json()).alarms || [] : [];
  const stats = overview.message_stats || {};
  const totals = overview.queue_totals || {};
  const objects = overview.object_totals || {};
  const version = `${overview.product_name || "RabbitMQ"} ${overview.product_version || overview.rabbitmq_version || ""}`;
  return [
    h("h1", {}, "Overview"),
    h("div", { class: "cards", id: "overview" },
      card("Node", [["Node", overview.node], ["Version", version], ["Management", overview.management_version || ""]]),
      card("Alarms", alarms.length
        ? alarms.map((a) => [h("span", { class: "alarm" }, a.resource), a.node])
        : [[h("span", { class: "okay", id: "no-alarms" }, "none"), ""]]),
      card("Queued messages", [["Ready", num(totals.messages_ready)], ["Unacked", num(totals.messages_unacknowledged)], ["Total", num(totals.messages)]]),
      card("Message rates", [["Publish", rate(stats, "publish")], ["Confirm", rate(stats, "confirm")],
        ["Deliver / get", rate(stats, "deliver_get")], ["Ack", rate(stats, "ack")], ["Redelivered", rate(stats, "redeliver")],
        ["Unroutable (dropped)", rate(stats, "drop_unroutable")], ["Unroutable (returned)", rate(stats, "return_unroutable")]]),
      card("Objects", ["connections", "channels", "exchanges", "queues", "consumers"].map((k) => [k[0].toUpperCase() + k.slice(1), num(objects[k])])),
    ),
    h("h2", {}, "Listeners"),
    table("listeners", [["Protocol", (l) => l.protocol], ["Address", (l) => l.ip_address], ["Port", (l) => l.port, "num"]], overview.listeners || []),
  ];
}

async function queuesPage(vhost) {
  const queues = items(await api("GET", "api/queues" + vhostPath(vhost)));
  const path = (q) => `api/queues/${enc(q.vhost)}/${enc(q.name)}`;
  return [
    h("h1", {}, "Queues"),
    table("queues", [
      ["Virtual host", (q) => q.vhost], ["Name", (q) => q.name], ["Type", (q) => q.type], ["Features", flags],
      ["State", (q) => q.state], ["Ready", (q) => num(q.messages_ready), "num"], ["Unacked", (q) => num(q.messages_unacknowledged), "num"],
      ["Total", (q) => num(q.messages), "num"], ["Incoming", (q) => rate(q.message_stats, "publish"), "num"],
      ["Deliver / get", (q) => rate(q.message_stats, "deliver_get"), "num"], ["Ack", (q) => rate(q.message_stats, "ack"), "num"],
      ["Consumers", (q) => num(q.consumers), "num"],
      ["", (q) => [
        h("button", { type: "button", class: "purge", onclick: () => act("Purge queue", `Remove every ready message of queue '${q.name}' in vhost '${q.vhost}'?`, undefined,
          () => api("DELETE", path(q) + "/contents"), `Queue '${q.name}' purged.`) }, "Purge"),
        h("button", { type: "button", class: "delete", onclick: () => act("Delete queue", `Delete queue '${q.name}' in vhost '${q.vhost}' and its messages?`, undefined,
          () => api("DELETE", path(q)), `Queue '${q.name}' deleted.`) }, "Delete"),
      ]],
    ], queues, "No queues."),
  ];
}

async function exchangesPage(vhost) {
  const [exchanges, bindings] = await Promise.all([api("GET", "api/exchanges" + vhostPath(vhost)), api("GET", "api/bindings" + vhostPath(vhost))]);
  return [
    h("h1", {}, "Exchanges"),
    table("exchanges", [
      ["Virtual host", (e) => e.vhost], ["Name", (e) => e.name || "(AMQP default)"], ["Type", (e) => e.type], ["Features", flags],
      ["Arguments", (e) => args(e.arguments)], ["Rate in", (e) => rate(e.message_stats, "publish_in"), "num"],
      ["Rate out", (e) => rate(e.message_stats, "publish_out"), "num"],
    ], items(exchanges), "No exchanges."),
    h("h2", {}, "Bindings"),
    table("bindings", [
      ["Virtual host", (b) => b.vhost], ["Source", (b) => b.source || "(AMQP default)"], ["Destination", (b) => b.destination],
      ["Destination type", (b) => b.destination_type], ["Routing key", (b) => b.routing_key], ["Arguments", (b) => args(b.arguments)],
    ], items(bindings), "No bindings."),
  ];
}

async function connectionsPage(vhost) {
  const connections = items(await api("GET", vhost ? `api/vhosts/${enc(vhost)}/connections` : "api/connections"));
  const client = (c) => {
    const p = c.client_properties || {};
    return [p.connection_name, p.product, p.version].filter(Boolean).join(" ");
  };
  return [
    h("h1", {}, "Connections"),
    table("connections", [
      ["Name", (c) => c.name], ["User", (c) => c.user], ["Virtual host", (c) => c.vhost],
      ["Peer", (c) => `${c.peer_host}:${c.peer_port}`], ["Client", client], ["Protocol", (c) => c.protocol],
      ["Channels", (c) => num(c.channels), "num"], ["State", (c) => c.state],
      ["From client", (c) => (rateOf(c, "recv_oct") === undefined ? "" : bytes(rateOf(c, "recv_oct")) + "/s"), "num"],
      ["To client", (c) => (rateOf(c, "send_oct") === undefined ? "" : bytes(rateOf(c, "send_oct")) + "/s"), "num"],
      ["", (c) => h("button", { type: "button", class: "close", onclick: () => act("Close connection", `Close connection '${c.name}' (user '${c.user}')?`, "Closed via web UI",
        (reason) => api("DELETE", `api/connections/${enc(c.name)}`, { headers: { "X-Reason": reason || "Closed via web UI" } }), `Connection '${c.name}' closed.`) }, "Close")],
    ], connections, "No connections."),
  ];
}

// Topics: GET /topics lists them where the broker has the route; otherwise the partitioned
// topics (x-key-partition exchanges) and stream queues are found through the management API.
async function topicNames(vhost) {
  try {
    return items(await api("GET", "topics" + topicQuery(vhost)), "topics").map((t) => (typeof t === "string" ? { name: t } : { ...t, name: t.name || t.topic }));
  } catch (e) {
    if (e.status !== 404 && e.status !== 405) throw e;
  }
  const [queues, exchanges, bindings] = await Promise.all(["queues", "exchanges", "bindings"].map((p) => api("GET", `api/${p}/${enc(vhost)}`)));
  const streams = new Set(queues.filter((q) => q.type === "stream").map((q) => q.name));
  const found = new Map();
  for (const e of exchanges.filter((x) => x.type === "x-key-partition")) {
    const parts = bindings.filter((b) => b.source === e.name && streams.has(b.destination)).map((b) => b.destination);
    if (parts.length) found.set(e.name, { name: e.name, partitions: new Set(parts).size, inside: parts });
  }
  const inside = new Set([...found.values()].flatMap((t) => t.inside));
  for (const s of streams) if (!inside.has(s) && !found.has(s)) found.set(s, { name: s, partitions: 1 });
  return [...found.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
}

async function topicsPage(vhost) {
  vhost = vhost || "/";
  const topics = await topicNames(vhost);
  const link = (t) => h("a", { href: `#/topics/${enc(t.name)}` }, t.name);
  return [
    h("h1", {}, `Topics in vhost '${vhost}'`),
    table("topics", [["Topic", link], ["Partitions", (t) => num(typeof t.partitions === "number" ? t.partitions : (t.partitions || []).length), "num"]], topics, "No topics."),
  ];
}

async function topicPage(vhost, topic) {
  vhost = vhost || "/";
  const base = `topics/${enc(topic)}`;
  let partitions;
  try {
    partitions = items(await api("GET", base + topicQuery(vhost)), "partitions");
  } catch (e) {
    if (e.status !== 404 && e.status !== 405) throw e;
    partitions = items(await api("GET", base + "/offsets" + topicQuery(vhost)), "partitions");
  }
  let groups = [];
  try {
    groups = items(await api("GET", base + "/groups" + topicQuery(vhost)), "groups").map((g) => (typeof g === "string" ? { group: g } : g));
  } catch (e) {
    if (e.status !== 404 && e.status !== 405) throw e;
  }
  const shown = store.getItem(KEY + "group:" + topic);
  const names = new Set(groups.map((g) => g.group || g.name));
  if (shown) names.add(shown);
  const lags = [];
  for (const name of [...names].sort()) {
    try {
      lags.push(await api("GET", `${base}/groups/${enc(name)}${topicQuery(vhost)}`));
    } catch (e) {
      if (e.status !== 404) throw e;
    }
  }
  const pick = (o, ...keys) => keys.map((k) => o[k]).find((v) => v !== undefined);
  const lookup = h("form", { id: "group-form", onsubmit: (ev) => {
    ev.preventDefault();
    store.setItem(KEY + "group:" + topic, $("group-name").value.trim());
    render();
  } }, h("label", {}, "Consumer group ", h("input", { id: "group-name", value: shown || "" })), " ", h("button", { type: "submit" }, "Show lag"));
  return [
    h("h1", {}, `Topic '${topic}' in vhost '${vhost}'`),
    h("p", {}, h("a", { href: "#/topics" }, "All topics")),
    h("h2", {}, "Partitions"),
    table("partitions", [
      ["Partition", (p) => p.partition, "num"], ["Queue", (p) => p.queue || ""],
      ["Log start", (p) => num(pick(p, "log_start", "earliest")), "num"], ["Log end", (p) => num(pick(p, "log_end", "latest")), "num"],
      ["Messages", (p) => num(p.messages), "num"], ["Segments", (p) => num(p.segments), "num"], ["Bytes", (p) => bytes(p.bytes), "num"],
    ], partitions),
    h("h2", {}, "Consumer groups"),
    groups.length ? table("groups", [["Group", (g) => g.group || g.name], ["State", (g) => g.state || ""], ["Members", (g) => num(g.members), "num"]], groups) : null,
    lookup,
    lags.map((g) => [
      h("h2", {}, `Group '${g.group}': lag ${num(g.lag)}`),
      table("lag-" + g.group, [
        ["Partition", (p) => p.partition, "num"], ["Committed", (p) => num(pick(p, "committed", "current_offset")), "num"],
        ["Log end", (p) => num(pick(p, "latest", "log_end")), "num"], ["Lag", (p) => num(p.lag), "num"],
        ["Consumer", (p) => pick(p, "reader", "consumer") || ""],
      ], g.partitions || []),
    ]),
  ];
}

async function definitionsPage(vhost) {
  const path = "api/definitions" + vhostPath(vhost);
  const where = vhost ? `vhost '${vhost}'` : "the whole broker";
  const download = async () => {
    try {
      const response = await api("GET", path, { raw: true });
      if (!response.ok) throw new ApiError(response.status, `GET ${path}: ${response.status}`);
      const url = URL.createObjectURL(await response.blob());
      const day = new Date().toISOString().slice(0, 10);
      const a = h("a", { href: url, download: `tqbroker-definitions${vhost ? "-" + vhost.replace(/[^\w.-]/g, "_") : ""}-${day}.json` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      flash(`Definitions of ${where} downloaded.`);
    } catch (e) {
      flash(e.message, true);
    }
  };
  const upload = async (ev) => {
    ev.preventDefault();
    const file = $("definitions-file").files[0];
    if (!file) return flash("Choose a definitions file (JSON) first.", true);
    try {
      await api("POST", path, { body: await file.text() });
      flash(`Definitions from '${file.name}' imported into ${where}.`);
    } catch (e) {
      flash(e.message, true);
    }
  };
  return [
    h("h1", {}, "Definitions"),
    h("p", {}, `Users, virtual hosts, permissions, queues, exchanges and bindings of ${where}, as RabbitMQ's definitions JSON.`),
    h("h2", {}, "Export"),
    h("button", { type: "button", id: "export", onclick: download }, "Download definitions"),
    h("h2", {}, "Import"),
    h("form", { id: "import-form", onsubmit: upload },
      h("input", { type: "file", id: "definitions-file", accept: ".json,application/json" }), " ",
      h("button", { type: "submit", id: "import" }, "Upload definitions")),
  ];
}

// ---- routing, login, refresh ---------------------------------------------------------------

const PAGES = { overview: overviewPage, queues: queuesPage, exchanges: exchangesPage, connections: connectionsPage, topics: topicsPage, definitions: definitionsPage };

async function render() {
  if (!store.getItem(KEY + "auth")) return showLogin();
  if ($("confirm").open) return schedule(); // never redraw under an open dialog
  const [page, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const name = PAGES[page] ? page : "overview";
  const vhost = $("vhost").value;
  const mine = ++rendering;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("current", a.dataset.page === name);
  try {
    const content = name === "topics" && rest.length ? await topicPage(vhost, decodeURIComponent(rest.join("/"))) : await PAGES[name](vhost);
    if (mine !== rendering || !store.getItem(KEY + "auth")) return; // a newer render (or a logout) won
    const view = $("view");
    view.replaceChildren(...[content].flat(3).filter((n) => n));
    view.dataset.page = name;
    view.dataset.loaded = String(mine);
  } catch (e) {
    if (e.status !== 401) flash(e.message, true);
  }
  schedule();
}

function schedule() {
  clearTimeout(timer);
  const seconds = Number($("refresh").value);
  if (seconds > 0) timer = setTimeout(render, seconds * 1000);
}

async function loadVhosts() {
  const vhosts = items(await api("GET", "api/vhosts"));
  const select = $("vhost");
  const chosen = store.getItem(KEY + "vhost") || "";
  select.replaceChildren(h("option", { value: "" }, "All"), ...vhosts.map((v) => h("option", { value: v.name }, v.name)));
  select.value = vhosts.some((v) => v.name === chosen) ? chosen : "";
}

async function start() {
  const who = await api("GET", "api/whoami");
  $("whoami").textContent = `${who.name}`;
  $("login").hidden = true;
  $("nav").hidden = $("session").hidden = $("view").hidden = false;
  await loadVhosts();
  await render();
}

function showLogin(message) {
  clearTimeout(timer);
  $("nav").hidden = $("session").hidden = $("view").hidden = true;
  $("view").replaceChildren();
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("login-error").hidden = !message;
  $("username").focus();
}

function logout(message) {
  store.removeItem(KEY + "auth");
  flash("");
  showLogin(message);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const credentials = `${$("username").value}:${$("password").value}`;
    store.setItem(KEY + "auth", "Basic " + btoa(String.fromCharCode(...new TextEncoder().encode(credentials))));
    $("password").value = "";
    try {
      await start();
    } catch (e) {
      if (e.status !== 401) logout(e.message);
    }
  });
  $("logout").addEventListener("click", () => logout());
  $("vhost").addEventListener("change", () => {
    store.setItem(KEY + "vhost", $("vhost").value);
    render();
  });
  $("refresh").value = store.getItem(KEY + "refresh") || "5";
  $("refresh").addEventListener("change", () => {
    store.setItem(KEY + "refresh", $("refresh").value);
    schedule();
  });
  window.addEventListener("hashchange", () => {
    flash("");
    render();
  });
  if (store.getItem(KEY + "auth")) start().catch((e) => e.status !== 401 && flash(e.message, true));
  else showLogin();
});
