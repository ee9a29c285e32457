// tqbroker's web UI: the pages, each an async function of the selected vhost returning the nodes
// to show (app.js has the API client, the DOM helpers, routing and login; it loads first).
"use strict";

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
  const [queues, note] = await listing("api/queues" + vhostPath(vhost), filterOf("queues"));
  const path = (q) => `api/queues/${enc(q.vhost)}/${enc(q.name)}`;
  return [
    h("h1", {}, "Queues"),
    filterForm("queues"),
    note && h("p", { class: "muted" }, note),
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
  const [[exchanges, note], bindings] = await Promise.all([listing("api/exchanges" + vhostPath(vhost), filterOf("exchanges")),
    api("GET", "api/bindings" + vhostPath(vhost))]);
  const shown = items(bindings).slice(0, PAGE_SIZE);
  return [
    h("h1", {}, "Exchanges"),
    filterForm("exchanges"),
    note && h("p", { class: "muted" }, note),
    table("exchanges", [
      ["Virtual host", (e) => e.vhost], ["Name", (e) => e.name || "(AMQP default)"], ["Type", (e) => e.type], ["Features", flags],
      ["Arguments", (e) => args(e.arguments)], ["Rate in", (e) => rate(e.message_stats, "publish_in"), "num"],
      ["Rate out", (e) => rate(e.message_stats, "publish_out"), "num"],
    ], exchanges, "No exchanges."),
    h("h2", {}, "Bindings"),
    shown.length < items(bindings).length ? h("p", { class: "muted" }, `Showing the first ${shown.length} of ${items(bindings).length}.`) : null,
    table("bindings", [
      ["Virtual host", (b) => b.vhost], ["Source", (b) => b.source || "(AMQP default)"], ["Destination", (b) => b.destination],
      ["Destination type", (b) => b.destination_type], ["Routing key", (b) => b.routing_key], ["Arguments", (b) => args(b.arguments)],
    ], shown, "No bindings."),
  ];
}

async function connectionsPage(vhost) {
  const [connections, note] = await listing(vhost ? `api/vhosts/${enc(vhost)}/connections` : "api/connections", filterOf("connections"));
  const client = (c) => {
    const p = c.client_properties || {};
    return [p.connection_name, p.product, p.version].filter(Boolean).join(" ");
  };
  return [
    h("h1", {}, "Connections"),
    filterForm("connections"),
    note && h("p", { class: "muted" }, note),
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

// "All" lists the topics of every vhost the user sees (the topic API answers for one at a time).
async function topicsPage(vhost) {
  const vhosts = vhost ? [vhost] : [...$("vhost").options].map((o) => o.value).filter(Boolean);
  const topics = [];
  for (const v of vhosts) for (const t of await topicNames(v)) topics.push({ ...t, vhost: v });
  const link = (t) => h("a", { href: `#/topics/${enc(t.vhost)}/${enc(t.name)}` }, t.name);
  return [
    h("h1", {}, vhost ? `Topics in vhost '${vhost}'` : "Topics"),
    table("topics", [["Virtual host", (t) => t.vhost], ["Topic", link], ["Partitions", (t) => num(typeof t.partitions === "number" ? t.partitions : (t.partitions || []).length), "num"]], topics, "No topics."),
  ];
}

async function topicPage(vhost, topic) {
  const base = `topics/${enc(topic)}`;
  let partitions;
  let described = {};
  try {
    described = await api("GET", base + topicQuery(vhost));
    partitions = items(described, "partitions");
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
  const shown = store.getItem(KEY + "group:" + vhost + ":" + topic);
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
    store.setItem(KEY + "group:" + vhost + ":" + topic, $("group-name").value.trim());
    render();
  } }, h("label", {}, "Consumer group ", h("input", { id: "group-name", value: shown || "" })), " ", h("button", { type: "submit" }, "Show lag"));
  return [
    h("h1", {}, `Topic '${topic}' in vhost '${vhost}'`),
    h("p", {}, h("a", { href: "#/topics" }, "All topics")),
    described.arguments && Object.keys(described.arguments).length ? h("p", { id: "topic-arguments" }, "Arguments: ", args(described.arguments)) : null,
    h("h2", {}, "Partitions"),
    table("partitions", [
      ["Partition", (p) => p.partition, "num"], ["Queue", (p) => p.queue || ""],
      ["Log start", (p) => num(pick(p, "log_start_offset", "earliest")), "num"], ["Log end", (p) => num(pick(p, "log_end_offset", "latest")), "num"],
      ["Messages", (p) => num(p.messages), "num"], ["Segments", (p) => num(p.segments), "num"], ["Bytes", (p) => bytes(p.bytes), "num"],
    ], partitions),
    h("h2", {}, "Consumer groups"),
    groups.length ? table("groups", [["Group", (g) => g.group || g.name], ["State", (g) => g.state || ""], ["Members", (g) => num(g.members), "num"]], groups) : null,
    lookup,
    lags.map((g) => [
      h("h2", {}, `Group '${g.group}': lag ${num(g.lag)}${g.state ? ", " + g.state : ""}`),
      table("lag-" + g.group, [
        ["Partition", (p) => p.partition, "num"], ["Committed", (p) => num(pick(p, "committed", "current_offset")), "num"],
        ["Log end", (p) => num(pick(p, "latest", "log_end")), "num"], ["Lag", (p) => num(p.lag), "num"],
        ["Consumer", (p) => pick(p, "reader") || ""], ["Connection", (p) => pick(p, "connection") || ""],
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
      if (!response.ok) await api("GET", path); // throws, with the API's reason
      const url = URL.createObjectURL(await response.blob());
      const day = new Date().toISOString().slice(0, 10);
      const a = h("a", { href: url, download: `tqbroker-definitions${vhost ? "-" + vhost.replace(/[^\w.-]/g, "_") : ""}-${day}.json` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      flash(`Definitions of ${where} downloaded.`);
    } catch (e) {
      if (!e.loggedOut) flash(e.message, true);
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
      if (!e.loggedOut) flash(e.message, true);
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

const PAGES = { overview: overviewPage, queues: queuesPage, exchanges: exchangesPage, connections: connectionsPage, topics: topicsPage, definitions: definitionsPage };
