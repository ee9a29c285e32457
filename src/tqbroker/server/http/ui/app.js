// tqbroker's web UI: hash-routed pages over the management API (RabbitMQ's paths and JSON) and
// the topic API. Plain DOM, no dependencies; data is always inserted as text, never as HTML.
// This file: the API client, DOM helpers, the confirmation dialog, routing, login and refresh;
// pages.js (loaded after it) has the pages (PAGES, topicPage).
"use strict";

const KEY = "tqbroker.ui.";
const store = window.sessionStorage;
const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent; // the vhost "/" travels as %2F, as RabbitMQ's clients send it
let timer = null;
let rendering = 0;

class ApiError extends Error {
  constructor(status, message, loggedOut = false) {
    super(message);
    this.status = status;
    this.loggedOut = loggedOut; // the credentials were refused: the login form is showing
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
  if (raw && response.status !== 401) return response;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (e) {
    data = null;
  }
  // 401 is both "who are you?" (not_authorized, Login failed) and, in RabbitMQ's API, "you may
  // not" (not_authorised): only the first sends the user back to the login form.
  if (response.status === 401 && !(data && data.error === "not_authorised")) {
    logout("Login refused: check the user name and password.");
    throw new ApiError(401, "login refused", true);
  }
  if (raw) return new Response(text, { status: response.status, headers: response.headers });
  if (!response.ok) {
    const why = data && (data.reason || data.message || data.error);
    throw new ApiError(response.status, `${method} ${path}: ${response.status} ${why || response.statusText}`);
  }
  return data;
}

// A list route's first PAGE_SIZE rows whose name contains `filter` (RabbitMQ's page, page_size
// and name parameters; a route that does not paginate answers a plain list): [rows, note].
const PAGE_SIZE = 500;
async function listing(path, filter) {
  const query = new URLSearchParams({ page: "1", page_size: String(PAGE_SIZE) });
  if (filter) query.set("name", filter);
  const data = await api("GET", `${path}?${query}`);
  const paged = data && !Array.isArray(data);
  const all = paged ? items(data) : items(data).filter((r) => String(r.name).includes(filter || ""));
  const rows = all.slice(0, PAGE_SIZE);
  const matching = paged ? data.filtered_count : all.length;
  return [rows, matching > rows.length ? `Showing the first ${rows.length} of ${matching}.` : null];
}

// The name filter of a list page (kept for the tab); submitting it redraws the page.
function filterForm(page) {
  const value = store.getItem(KEY + "filter:" + page) || "";
  return h("form", { class: "filter", id: "filter-form", onsubmit: (ev) => {
    ev.preventDefault();
    store.setItem(KEY + "filter:" + page, $("filter").value.trim());
    render();
  } }, h("label", {}, "Name contains ", h("input", { id: "filter", value })), " ", h("button", { type: "submit" }, "Filter"));
}
const filterOf = (page) => store.getItem(KEY + "filter:" + page) || "";

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
  let message = done;
  let failed = false;
  try {
    await action(answer);
  } catch (e) {
    if (e.loggedOut) return;
    [message, failed] = [e.message, true];
  }
  await render(); // the outcome is announced once the page shows it
  flash(message, failed);
}

// ---- routing, login, refresh ---------------------------------------------------------------

async function render() {
  if (!store.getItem(KEY + "auth")) return showLogin();
  if ($("confirm").open) return schedule(); // never redraw under an open dialog
  const [page, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const name = PAGES[page] ? page : "overview";
  const vhost = $("vhost").value;
  const mine = ++rendering;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("current", a.dataset.page === name);
  try {
    // #/topics/{vhost}/{topic}, each URL-encoded: one topic's page.
    const [topicVhost, topic] = rest.map(decodeURIComponent);
    const content = name === "topics" && topic !== undefined ? await topicPage(topicVhost, topic) : await PAGES[name](vhost);
    if (mine !== rendering || !store.getItem(KEY + "auth")) return; // a newer render (or a logout) won
    const view = $("view");
    view.replaceChildren(...[content].flat(3).filter((n) => n));
    view.dataset.page = name;
    view.dataset.loaded = String(mine);
  } catch (e) {
    if (e.loggedOut || mine !== rendering) return;
    flash(e.message, true);
    $("view").replaceChildren(h("p", { class: "muted" }, "This page could not be loaded."));
    $("view").dataset.page = name;
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
      if (!e.loggedOut) logout(e.message);
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
  if (store.getItem(KEY + "auth")) start().catch((e) => e.loggedOut || flash(e.message, true));
  else showLogin();
});
