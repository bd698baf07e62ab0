"use strict";
(function () {
const t0 = performance.now();
const D = JSON.parse(document.getElementById("graph-data").textContent);
const n = D.name.length;
const CAT_COLOURS = D.categories.map(c => getComputedStyle(document.documentElement).getPropertyValue("--" + c).trim());
const DX = 66, DY = 20, NODE_W = 44, NODE_H = 13, ROW_H = 22, CROSSING_EDGES_UP_TO = 3000;

// ---- adjacency -------------------------------------------------------------
const inputs = Array.from({length: n}, () => []), outputs = Array.from({length: n}, () => []);
for (let k = 0; k < D.edges.length; k += 2) { outputs[D.edges[k]].push(D.edges[k + 1]); inputs[D.edges[k + 1]].push(D.edges[k]); }
const ctlIn = i => D.control_of[i] < 0 ? [] : D.control_sets[D.control_of[i]];
const byName = new Map(D.name.map((s, i) => [s, i]));

// ---- positions: wrap the column sequence into bands that fit the window -----
const X = new Float64Array(n), Y = new Float64Array(n), band = new Int32Array(n);
let worldW = 1, worldH = 1, bandTop = [0];
function wrapBands() {
  let cols = 0;
  for (let i = 0; i < n; i++) cols = Math.max(cols, D.col[i] + 1);
  const height = new Int32Array(cols);
  for (let i = 0; i < n; i++) height[D.col[i]] = Math.max(height[D.col[i]], D.row[i] + 1);
  const el = document.getElementById("main"), W = (el.clientWidth || 1000) - 24, H = (el.clientHeight || 700) - 78;
  const bandHeight = (b, per) => { let m = 0; for (let c = b * per; c < Math.min(cols, (b + 1) * per); c++) m = Math.max(m, height[c]); return (m + 2) * DY; };
  const fitScale = bands => {
    const per = Math.ceil(cols / bands);
    let h = 0; for (let b = 0; b < bands; b++) h += bandHeight(b, per);
    return Math.min(W / (per * DX), H / h);
  };
  // Wrap into bands when that draws the nodes at least a third larger than one long row.
  let best = 1, bestScale = fitScale(1);
  for (let bands = 2; bands <= cols; bands++) {
    const s = fitScale(bands);
    if (s > bestScale * (best === 1 ? 1.33 : 1)) { best = bands; bestScale = s; } else if (s < bestScale * 0.8) break;
  }
  const per = Math.ceil(cols / best);
  let top = 0;
  const bandMid = [];
  bandTop = [];
  for (let b = 0; b < best; b++) { const h = bandHeight(b, per); bandTop.push(top); bandMid.push(top + h / 2); top += h; }
  bandTop.push(top);
  for (let i = 0; i < n; i++) {
    const c = D.col[i], b = Math.floor(c / per);
    band[i] = b; X[i] = (c - b * per) * DX + DX / 2;
    Y[i] = bandMid[b] + (D.row[i] - (height[c] - 1) / 2) * DY;
  }
  worldW = per * DX; worldH = Math.max(top, DY);
}

// ---- view state ---------------------------------------------------------------
const canvas = document.getElementById("canvas"), ctx = canvas.getContext("2d");
let scale = 1, ox = 0, oy = 0, dpr = window.devicePixelRatio || 1;
let selected = -1, hover = -1, query = "";
const hiddenCat = new Set();
let matches = null;           // Uint8Array of search hits, or null when no search
let shown = [];               // indices listed in the side panel
let pending = false;

function resize() {
  const r = canvas.getBoundingClientRect();
  canvas.width = Math.max(1, Math.round(r.width * dpr)); canvas.height = Math.max(1, Math.round(r.height * dpr));
}
function fit() {             // leave room for the Fit button above and the status line below
  const r = canvas.getBoundingClientRect(), top = 48, bottom = 30, side = 12;
  scale = Math.min((r.width - 2 * side) / worldW, (r.height - top - bottom) / worldH);
  ox = (r.width - worldW * scale) / 2; oy = top + (r.height - top - bottom - worldH * scale) / 2;
  redraw();
}
function centreOn(i) {
  const r = canvas.getBoundingClientRect();
  if (scale < 1.2) scale = 1.6;
  ox = r.width / 2 - X[i] * scale; oy = r.height / 2 - Y[i] * scale;
}
function redraw() { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); } }

// ---- drawing -------------------------------------------------------------------
function visible(i) { return !hiddenCat.has(D.cat[i]); }
function draw() {
  const r = canvas.getBoundingClientRect(), W = r.width, H = r.height;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, W, H);
  const x0 = -ox / scale, y0 = -oy / scale, x1 = (W - ox) / scale, y1 = (H - oy) / scale;
  const inView = i => X[i] >= x0 - DX && X[i] <= x1 + DX && Y[i] >= y0 - DY && Y[i] <= y1 + DY;
  ctx.setTransform(dpr * scale, 0, 0, dpr * scale, dpr * ox, dpr * oy);
  const hw = NODE_W / 2, hh = NODE_H / 2;
  ctx.fillStyle = "#f1f3f5";           // every other band on a light stripe
  for (let b = 1; b < bandTop.length; b += 2) ctx.fillRect(0, bandTop[b], worldW, bandTop[b + 1] - bandTop[b]);
  // edges within a band; edges across bands only for the selected node
  if (NODE_W * scale >= 8) {   // below that, edges would only grey the colours out
    ctx.lineWidth = 1 / scale;
    const alpha = Math.min(0.4, 0.08 * NODE_W * scale / 8) * (matches ? 0.4 : 1);
    ctx.strokeStyle = `rgba(73,80,87,${alpha.toFixed(3)})`;
    ctx.beginPath();
    const crossing = [];
    for (let k = 0; k < D.edges.length; k += 2) {
      const s = D.edges[k], d = D.edges[k + 1];
      if (band[s] !== band[d]) { if (n <= CROSSING_EDGES_UP_TO) crossing.push(s, d); continue; }
      if (!(inView(s) || inView(d))) continue;
      ctx.moveTo(X[s] + hw, Y[s]); ctx.lineTo(X[d] - hw, Y[d]);
    }
    ctx.stroke();
    if (crossing.length) {     // from one band to another: a curve leaving right, arriving from the left
      ctx.strokeStyle = "rgba(73,80,87,0.22)"; ctx.beginPath();
      for (let k = 0; k < crossing.length; k += 2) {
        const s = crossing[k], d = crossing[k + 1], bend = 3 * DX;
        ctx.moveTo(X[s] + hw, Y[s]);
        ctx.bezierCurveTo(X[s] + hw + bend, Y[s], X[d] - hw - bend, Y[d], X[d] - hw, Y[d]);
      }
      ctx.stroke();
    }
  }
  if (selected >= 0) drawEdgesOf(selected, hw);
  // nodes, batched by colour
  const small = NODE_W * scale < 24;     // rounded corners only where they show (and cost)
  for (let c = 0; c < D.categories.length; c++) {
    if (hiddenCat.has(c)) continue;
    for (const dim of [true, false]) {
      if (dim && !matches) continue;
      ctx.globalAlpha = dim ? 0.15 : 1;
      ctx.fillStyle = CAT_COLOURS[c];
      ctx.beginPath();
      for (let i = 0; i < n; i++) {
        if (D.cat[i] !== c || !inView(i)) continue;
        if (matches && (matches[i] === 1) === dim) continue;
        if (small) ctx.rect(X[i] - hw, Y[i] - hh, NODE_W, NODE_H);
        else roundRect(X[i] - hw, Y[i] - hh, NODE_W, NODE_H, 3);
      }
      ctx.fill();
    }
  }
  ctx.globalAlpha = 1;
  if (matches) {            // outline the hits so they stand out at any zoom
    ctx.strokeStyle = "#212529"; ctx.lineWidth = Math.max(1, 1.5 / scale);
    ctx.beginPath();
    for (let i = 0; i < n; i++) if (matches[i] && visible(i) && inView(i)) ctx.rect(X[i] - hw - 2 / scale, Y[i] - hh - 2 / scale, NODE_W + 4 / scale, NODE_H + 4 / scale);
    ctx.stroke();
  }
  if (selected >= 0) {
    ctx.strokeStyle = "#000"; ctx.lineWidth = Math.max(2, 3 / scale);
    ctx.strokeRect(X[selected] - hw - 3 / scale, Y[selected] - hh - 3 / scale, NODE_W + 6 / scale, NODE_H + 6 / scale);
  }
  if (NODE_W * scale >= 30) drawLabels(inView);
  document.getElementById("hud").textContent =
    `zoom ${scale < 0.1 ? scale.toFixed(3) : scale.toFixed(2)} · drag to pan, wheel to zoom, click a node`;
}
function roundRect(x, y, w, h, r) {
  ctx.moveTo(x + r, y); ctx.arcTo(x + w, y, x + w, y + h, r); ctx.arcTo(x + w, y + h, x, y + h, r);
  ctx.arcTo(x, y + h, x, y, r); ctx.arcTo(x, y, x + w, y, r); ctx.closePath();
}
function drawEdgesOf(i, hw) {
  ctx.lineWidth = Math.max(1.5, 2 / scale);
  ctx.strokeStyle = "#1971c2"; ctx.beginPath();
  for (const s of inputs[i]) { ctx.moveTo(X[s] + hw, Y[s]); ctx.lineTo(X[i] - hw, Y[i]); }
  ctx.stroke();
  ctx.strokeStyle = "#e8590c"; ctx.beginPath();
  for (const d of outputs[i]) { ctx.moveTo(X[i] + hw, Y[i]); ctx.lineTo(X[d] - hw, Y[d]); }
  ctx.stroke();
}
function fitted(text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let lo = 0, hi = text.length;
  while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (ctx.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1; }
  return text.slice(0, lo) + "…";
}
function drawLabels(inView) {
  ctx.textBaseline = "middle"; ctx.textAlign = "center";
  const size = Math.min(NODE_H * 0.8, 12 / scale);        // about 12 screen pixels, never taller than a node
  ctx.font = `${size}px system-ui, sans-serif`;
  const detailed = NODE_H * scale >= 22;
  for (let i = 0; i < n; i++) {
    if (!inView(i) || !visible(i)) continue;
    ctx.globalAlpha = matches && !matches[i] ? 0.3 : 1;
    ctx.fillStyle = D.cat[i] === 5 || (matches && !matches[i]) ? "#212529" : "#fff";
    ctx.fillText(fitted(D.ops[D.op[i]], NODE_W - 3), X[i], Y[i] + 0.3);
    if (detailed) {
      const nm = D.name[i], short = nm.slice(nm.lastIndexOf("/") + 1);
      ctx.fillStyle = "#495057";
      ctx.fillText(fitted(short, DX - 4), X[i], Y[i] + NODE_H * 0.5 + size * 0.6);
    }
  }
  ctx.globalAlpha = 1;
}

// ---- picking and interaction ------------------------------------------------------
function nodeAt(px, py) {
  const wx = (px - ox) / scale, wy = (py - oy) / scale;
  let best = -1, bestD = Infinity;
  const reach = Math.max(NODE_W, 6 / scale);
  for (let i = 0; i < n; i++) {
    if (!visible(i)) continue;
    const dx = Math.abs(X[i] - wx), dy = Math.abs(Y[i] - wy);
    if (dx > reach || dy > reach) continue;
    const d = dx * dx + dy * dy * 4;
    if (d < bestD) { bestD = d; best = i; }
  }
  return best;
}
let drag = null;
canvas.addEventListener("mousedown", e => { drag = {x: e.clientX, y: e.clientY, ox, oy, moved: false}; canvas.style.cursor = "grabbing"; });
window.addEventListener("mouseup", e => {
  if (drag && !drag.moved) {
    const r = canvas.getBoundingClientRect(), i = nodeAt(e.clientX - r.left, e.clientY - r.top);
    if (i >= 0) goTo(i, false);
  }
  drag = null; canvas.style.cursor = "grab";
});
window.addEventListener("mousemove", e => {
  const r = canvas.getBoundingClientRect();
  if (drag) {
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    ox = drag.ox + dx; oy = drag.oy + dy; redraw(); return;
  }
  if (e.target !== canvas) return;
  const i = nodeAt(e.clientX - r.left, e.clientY - r.top), tip = document.getElementById("tip");
  if (i !== hover) {
    hover = i;
    if (i < 0) tip.style.display = "none";
    else { tip.textContent = `${D.name[i]}  (${D.ops[D.op[i]]}, ${D.categories[D.cat[i]]})`; tip.style.display = "block"; }
  }
  if (i >= 0) { tip.style.left = Math.min(e.clientX - r.left + 12, r.width - tip.offsetWidth - 4) + "px"; tip.style.top = (e.clientY - r.top + 14) + "px"; }
});
canvas.addEventListener("wheel", e => {
  e.preventDefault();
  const r = canvas.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
  const f = Math.exp(-e.deltaY * 0.0015), ns = Math.min(40, Math.max(0.002, scale * f));
  ox = px - (px - ox) * ns / scale; oy = py - (py - oy) * ns / scale; scale = ns; redraw();
}, {passive: false});
document.getElementById("fit").addEventListener("click", fit);
window.addEventListener("resize", () => { resize(); redraw(); });
window.addEventListener("keydown", e => {
  if (e.target.tagName === "INPUT") { if (e.key === "Escape") e.target.blur(); return; }
  if (e.key === "/") { e.preventDefault(); search.focus(); }
  else if (e.key === "f") fit();
  else if (e.key === "Escape") { selected = -1; showDetails(); redraw(); }
});

// ---- search and the virtualized list ---------------------------------------------
const search = document.getElementById("search"), list = document.getElementById("list"), spacer = document.getElementById("spacer");
const lowerNames = D.name.map(s => s.toLowerCase()), lowerOps = D.ops.map(s => s.toLowerCase());
function applyQuery(text) {
  query = text.trim().toLowerCase();
  matches = query ? new Uint8Array(n) : null;
  shown = [];
  for (const i of D.list_order) {
    const hit = !query || lowerNames[i].includes(query) || lowerOps[D.op[i]] === query;
    if (matches && hit) matches[i] = 1;
    if (hit && visible(i)) shown.push(i);
  }
  document.getElementById("count").textContent = query
    ? `${shown.length.toLocaleString()} of ${n.toLocaleString()} nodes match “${text.trim()}”`
    : `${shown.length.toLocaleString()} nodes`;
  spacer.style.height = Math.max(shown.length, 1) * ROW_H + "px";
  spacer.dataset.empty = shown.length ? "" : "No node matches.";
  list.scrollTop = 0;
  renderRows(); redraw();
}
const rowPool = [];
function renderRows() {
  const first = Math.max(0, Math.floor(list.scrollTop / ROW_H) - 5);
  const last = Math.min(shown.length, first + Math.ceil(list.clientHeight / ROW_H) + 10);
  let used = 0;
  for (let k = first; k < last; k++, used++) {
    let row = rowPool[used];
    if (!row) {
      row = document.createElement("div"); row.className = "row";
      row.innerHTML = '<span class="sw"></span><span class="nm"></span><span class="op"></span>';
      row.addEventListener("click", () => goTo(+row.dataset.i, true));
      spacer.appendChild(row); rowPool.push(row);
    }
    const i = shown[k];
    row.dataset.i = i; row.style.top = k * ROW_H + "px"; row.style.display = "flex";
    row.children[0].style.background = CAT_COLOURS[D.cat[i]];
    row.children[2].textContent = D.ops[D.op[i]];
    row.children[1].title = D.name[i];
    row.children[1].textContent = middleFit(D.name[i], row.children[1].clientWidth);
    row.classList.toggle("sel", i === selected);
  }
  for (let k = used; k < rowPool.length; k++) rowPool[k].style.display = "none";
}
// Long names lose their middle, so the layer (head) and the op (tail) both stay visible.
const measure = document.createElement("canvas").getContext("2d");
function middleFit(text, width) {
  const style = getComputedStyle(list);
  measure.font = `${style.fontSize} ${style.fontFamily}`;
  const fits = s => measure.measureText(s).width <= width;
  return width > 0 ? shortenMiddle(text, fits) : text;
}
function shortenMiddle(text, fits) {
  if (fits(text)) return text;
  const cut = k => { const head = Math.ceil(k * 0.4); return text.slice(0, head) + "\u2026" + text.slice(text.length - (k - head)); };
  let lo = 0, hi = text.length - 1;
  while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (fits(cut(mid))) lo = mid; else hi = mid - 1; }
  return cut(lo);
}
list.addEventListener("scroll", renderRows);
search.addEventListener("input", () => applyQuery(search.value));
search.addEventListener("keydown", e => { if (e.key === "Enter" && shown.length) goTo(shown[0], true); });

// ---- legend and details -----------------------------------------------------------
function buildLegend() {
  const counts = new Array(D.categories.length).fill(0);
  for (let i = 0; i < n; i++) counts[D.cat[i]]++;
  const legend = document.getElementById("legend");
  D.categories.forEach((c, k) => {
    const label = document.createElement("label");
    label.title = D.category_help[k];
    const box = document.createElement("input"); box.type = "checkbox"; box.checked = true;
    box.addEventListener("change", () => { box.checked ? hiddenCat.delete(k) : hiddenCat.add(k); applyQuery(search.value); });
    const sw = document.createElement("span"); sw.className = "sw"; sw.style.background = CAT_COLOURS[k];
    label.append(box, sw, document.createTextNode(`${c} (${counts[k].toLocaleString()})`));
    legend.appendChild(label);
  });
  const s = D.summary, share = s.half_flop_share === null ? "unknown" : (100 * s.half_flop_share).toFixed(1) + "%";
  document.getElementById("stats").innerHTML = "";
  for (const [k, v] of [["target", s.target], ["level", s.level], ["device", s.device_type],
      ["converted", `${s.converted.toLocaleString()} / ${s.nodes_total.toLocaleString()}`],
      ["casts", s.casts.toLocaleString()], ["MatMul/Conv FLOPs in half", share]]) {
    const span = document.createElement("span"); span.className = "stat";
    span.append(document.createTextNode(k + " "));
    const b = document.createElement("b"); b.textContent = v; span.append(b);
    document.getElementById("stats").append(span);
  }
}
function buildDoctor() {  // the doctor's bound and findings, node names linking to the nodes
  if (!D.doctor) return;
  const box = document.getElementById("doctor"), body = document.getElementById("doctor-body");
  const b = D.doctor.bound, index = new Map(D.name.map((name, i) => [name, i]));
  const head = document.createElement("div");
  head.textContent = b.speedup_bound === null ? "bound: unknown (no heavy op with a known shape)"
    : `bound: at most ${b.speedup_bound.toFixed(2)}x the float32 speed`;
  const list = document.createElement("ol");
  for (const f of D.doctor.findings) {
    const li = document.createElement("li");
    const share = f.share === null ? "share ?" : `${(100 * f.share).toFixed(1)}% of ${f.measure.replace("_", " ")}`;
    li.append(document.createTextNode(`[${share}] ${f.kind}: `));
    f.nodes.slice(0, 3).forEach((name, k) => {
      if (k) li.append(document.createTextNode(", "));
      li.append(index.has(name) ? link(index.get(name)) : document.createTextNode(name));
    });
    const why = document.createElement("div"); why.textContent = f.why;
    const fix = document.createElement("div"); fix.textContent = "fix: " + f.fix;
    li.append(why, fix); list.append(li);
  }
  body.append(head, list); box.hidden = false;
}
function link(i) {
  const a = document.createElement("a"); a.textContent = D.name[i]; a.href = "#node=" + encodeURIComponent(D.name[i]);
  return a;
}
function showDetails() {
  const box = document.getElementById("details");
  box.textContent = "";
  if (selected < 0) { box.innerHTML = '<span class="muted">Click a node in the list or the drawing.</span>'; return; }
  const i = selected, h = document.createElement("h2"); h.textContent = D.name[i]; box.append(h);
  const dl = document.createElement("dl");
  const add = (k, v) => { const dt = document.createElement("dt"); dt.textContent = k; const dd = document.createElement("dd");
    if (v instanceof Node) dd.append(v); else dd.textContent = v; dl.append(dt, dd); };
  const sw = document.createElement("span"); sw.className = "sw"; sw.style.background = CAT_COLOURS[D.cat[i]];
  const cat = document.createElement("span"); cat.append(sw, document.createTextNode(" " + D.categories[D.cat[i]] + " — " + D.category_help[D.cat[i]]));
  add("op", D.ops[D.op[i]]); add("precision", cat); add("dtype", D.dtypes[D.dtype[i]] || "—");
  add("list colour", D.colours[D.colour[i]]); add("rule", D.rules[D.rule[i]] || "—");
  add("converted", D.converted[i] ? "yes" : "no");
  add("cause", D.cause[i] >= 0 ? link(D.cause[i]) : "—");
  const many = (label, items) => { if (!items.length) return; const span = document.createElement("span");
    items.slice(0, 50).forEach((j, k) => { if (k) span.append(document.createElement("br")); span.append(link(j)); });
    if (items.length > 50) span.append(document.createTextNode(` … ${items.length - 50} more`)); add(label, span); };
  many("inputs", inputs[i]); many("control inputs", ctlIn(i)); many("consumers", outputs[i]);
  box.append(dl);
}
function goTo(i, centre) {
  selected = i;
  if (centre) centreOn(i);
  const k = shown.indexOf(i);
  if (k >= 0 && (k * ROW_H < list.scrollTop || (k + 1) * ROW_H > list.scrollTop + list.clientHeight))
    list.scrollTop = Math.max(0, k * ROW_H - list.clientHeight / 2);
  history.replaceState(null, "", "#node=" + encodeURIComponent(D.name[i]));
  showDetails(); renderRows(); redraw();
}

// ---- the URL hash: #search=TEXT or #node=NAME --------------------------------------
function readHash() {
  const h = location.hash.slice(1);
  for (const part of h.split("&")) {
    const eq = part.indexOf("="); if (eq < 0) continue;
    const key = part.slice(0, eq), value = decodeURIComponent(part.slice(eq + 1).replace(/\+/g, " "));
    if (key === "search") { search.value = value; applyQuery(value); if (shown.length === 1) goTo(shown[0], true); }
    else if (key === "node" && byName.has(value)) goTo(byName.get(value), true);
  }
}
window.addEventListener("hashchange", readHash);

// ---- start --------------------------------------------------------------------------
resize(); wrapBands(); buildLegend(); buildDoctor(); fit(); applyQuery(""); readHash(); draw();
const ms = performance.now() - t0;
document.getElementById("count").dataset.renderMs = ms.toFixed(0);
document.title = document.title;
console.log(`graph report: ${n} nodes drawn in ${ms.toFixed(0)} ms`);
})();
