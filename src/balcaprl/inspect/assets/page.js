// balcaprl inspect: renders the page's cards from the JSON data block. Every text from the data is
// set with textContent (never parsed as markup): captions, references and judge answers are untrusted.
// Cards are rendered in chunks as the reader scrolls, so a page of 10,000 captions opens at once.
"use strict";
(function () {
  const started = performance.now();
  const DATA = JSON.parse(document.getElementById("balcaprl-data").textContent);
  const parsed = performance.now();
  const CARDS = DATA.cards;
  const IMAGES = DATA.images;
  const STRINGS = DATA.strings; // references and assertion texts, by index
  const STATUS = { v: "verified", h: "hallucinated", m: "meta" };
  const CHUNK = 40;
  const MARKS = { verified: "\u2713", hallucinated: "\u2717", meta: "\u25cc" };
  const MARK_TITLES = {
    verified: "verified: pointable and visible",
    hallucinated: "not visible: hallucinated",
    meta: "not pointable: meta-commentary",
  };
  const SORTS = [
    ["order", "file order"], ["group", "prompt group, by advantage"], ["b_capscore", "b-CapScore"],
    ["precision", "precision"], ["recall", "recall"], ["linguistic", "linguistic (as rewarded)"],
    ["linguistic_raw", "linguistic (judge, unmasked)"], ["clarity", "clarity"], ["fluency", "fluency"],
    ["coherency", "coherency"], ["ratio", "length ratio"], ["advantage", "advantage"],
    ["meta", "meta-commentary share"], ["halluc", "hallucination share"],
  ];
  const DEFAULTS = { source: "all", step: "all", sort: "order", order: "desc", failure: "all",
    meta: "0", halluc: "0", masked: "0", q: "" };

  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  };
  const fmt = (v, digits) => (v === null || v === undefined ? "\u2013" : Number(v).toFixed(digits));
  const has = (v) => v !== null && v !== undefined;

  // ---------------------------------------------------------------------------------- header
  document.title = "balcaprl inspect: " + DATA.title;
  const header = el("header", "page");
  header.appendChild(el("h1", null, DATA.title));
  const judged = CARDS.filter((c) => c.failure === null).length;
  const KINDS = { scores: "scores folder", evaluation: "evaluation", training: "training run", demo: "demo run" };
  header.appendChild(el("div", "sub", (KINDS[DATA.kind] || DATA.kind) + " \u00b7 " + CARDS.length + " captions, " + judged + " judged, " +
    (CARDS.length - judged) + " failed \u00b7 " + DATA.sources.length + " source(s) \u00b7 written " + DATA.generated));
  if (DATA.notes.length) {
    const notes = el("ul", "notes");
    DATA.notes.forEach((n) => notes.appendChild(el("li", null, n)));
    header.appendChild(notes);
  }
  document.body.appendChild(header);

  if (DATA.runs.length) {
    const runs = el("section", "runs");
    DATA.runs.forEach((run) => {
      const box = el("details", "run");
      box.open = true;
      box.appendChild(el("summary", null, run.label + ": rewards and caption length over RL steps"));
      if (run.curves) {
        const img = el("img");
        img.alt = "reward and length curves of " + run.label;
        img.src = run.curves;
        box.appendChild(img);
      }
      box.appendChild(el("div", "facts", run.facts));
      runs.appendChild(box);
    });
    document.body.appendChild(runs);
  }

  // -------------------------------------------------------------------------------- controls
  const controls = el("div", "controls");
  const select = (name, label, options) => {
    const wrap = el("label", null, label + " ");
    const s = el("select");
    s.name = name;
    s.id = "ctl-" + name;
    options.forEach(([value, text]) => {
      const o = el("option", null, text);
      o.value = value;
      s.appendChild(o);
    });
    wrap.appendChild(s);
    controls.appendChild(wrap);
    return s;
  };
  const check = (name, label) => {
    const wrap = el("label");
    const c = el("input");
    c.type = "checkbox";
    c.name = name;
    c.id = "ctl-" + name;
    wrap.appendChild(c);
    wrap.appendChild(document.createTextNode(label));
    controls.appendChild(wrap);
    return c;
  };
  const sources = [["all", "all sources"]].concat(DATA.sources.map((s, i) => [String(i), s]));
  const steps = Array.from(new Set(CARDS.filter((c) => has(c.step)).map((c) => c.step))).sort((a, b) => a - b);
  const reasons = Array.from(new Set(CARDS.filter((c) => c.failure !== null).map((c) => c.failure))).sort();
  const ctl = {
    source: select("source", "source", sources),
    step: select("step", "step", [["all", "all steps"]].concat(steps.map((s) => [String(s), String(s)]))),
    sort: select("sort", "sort by", SORTS),
    order: select("order", "", [["desc", "high first"], ["asc", "low first"]]),
    failure: select("failure", "judge outcome", [["all", "all"], ["judged", "judged"], ["failed", "failed (any reason)"]]
      .concat(reasons.map((r) => ["reason:" + r, "failed: " + r]))),
    meta: check("meta", "meta-commentary only"),
    halluc: check("halluc", "hallucinated only"),
    masked: check("masked", "length mask applied"),
  };
  const search = el("input");
  search.type = "search";
  search.id = "ctl-q";
  search.placeholder = "search captions";
  controls.appendChild(search);
  ctl.q = search;
  if (DATA.sources.length < 2) ctl.source.parentNode.style.display = "none";
  if (!steps.length) {
    ctl.step.parentNode.style.display = "none";
    ctl.sort.querySelector("option[value=group]").remove();
    ctl.sort.querySelector("option[value=advantage]").remove();
  }
  const count = el("span", "count");
  count.id = "count";
  controls.appendChild(count);
  document.body.appendChild(controls);

  const legend = el("div", "legend");
  [["verified", "verified"], ["hallucinated", "not visible (hallucinated)"], ["meta", "not pointable (meta-commentary)"]]
    .forEach(([k, t]) => legend.appendChild(el("span", null, MARKS[k] + " " + t)));
  legend.appendChild(el("span", null, "reference: \u25cf covered, \u25cb missed"));
  document.body.appendChild(legend);

  const main = el("main");
  const list = el("div");
  list.id = "cards";
  const sentinel = el("div");
  sentinel.id = "sentinel";
  main.appendChild(list);
  main.appendChild(sentinel);
  document.body.appendChild(main);

  // ------------------------------------------------------------------------------ state, view
  const state = Object.assign({}, DEFAULTS);
  if (steps.length) {
    state.step = String(steps[steps.length - 1]);
    state.sort = "group";
    const firstRollouts = CARDS.find((c) => has(c.step));
    state.source = firstRollouts ? String(firstRollouts.source) : "all";
  }
  const defaults = Object.assign({}, state);
  const readHash = () => {
    // the fragment names the whole view: what it leaves out takes its default
    const params = new URLSearchParams(location.hash.slice(1));
    Object.keys(DEFAULTS).forEach((k) => (state[k] = params.has(k) ? params.get(k) : defaults[k]));
  };
  const writeHash = () => {
    const params = new URLSearchParams();
    Object.keys(DEFAULTS).forEach((k) => {
      if (state[k] !== defaults[k]) params.set(k, state[k]);
    });
    const hash = params.toString();
    try {
      history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
    } catch (error) {
      // a browser that refuses history changes on file:// pages: the view just is not in the URL
    }
  };
  const showState = () => {
    ["source", "step", "sort", "order", "failure"].forEach((k) => {
      ctl[k].value = state[k];
      if (ctl[k].value !== state[k]) state[k] = ctl[k].value = defaults[k]; // an unknown value
    });
    ["meta", "halluc", "masked"].forEach((k) => (ctl[k].checked = state[k] === "1"));
    ctl.q.value = state.q;
    ctl.order.disabled = state.sort === "order"; // file order has no direction
  };

  const keep = (c) => {
    if (state.source !== "all" && String(c.source) !== state.source) return false;
    if (state.step !== "all" && has(c.step) && String(c.step) !== state.step) return false;
    if (state.failure === "judged" && c.failure !== null) return false;
    if (state.failure === "failed" && c.failure === null) return false;
    if (state.failure.startsWith("reason:") && c.failure !== state.failure.slice(7)) return false;
    if (state.meta === "1" && !(c.meta > 0)) return false;
    if (state.halluc === "1" && !(c.halluc > 0)) return false;
    if (state.masked === "1" && c.masked !== true) return false;
    if (state.q) {
      const q = state.q.toLowerCase();
      if (!(c.caption || "").toLowerCase().includes(q) && !String(c.id).toLowerCase().includes(q)) return false;
    }
    return true;
  };
  const byKey = (key, sign) => (a, b) => {
    const x = CARDS[a][key], y = CARDS[b][key];
    if (!has(x) && !has(y)) return a - b;
    if (!has(x)) return 1; // missing values last, whatever the order
    if (!has(y)) return -1;
    return x === y ? a - b : sign * (x < y ? -1 : 1);
  };
  const grouped = () => state.sort === "group";
  let view = [];
  const compute = () => {
    view = [];
    for (let i = 0; i < CARDS.length; i++) if (keep(CARDS[i])) view.push(i);
    const sign = state.order === "asc" ? 1 : -1;
    if (state.sort === "group") {
      const adv = byKey("advantage", sign);
      view.sort((a, b) => {
        const x = CARDS[a], y = CARDS[b];
        if (x.source !== y.source) return x.source - y.source;
        if (has(x.step) !== has(y.step)) return has(x.step) ? -1 : 1;
        if (has(x.step) && x.step !== y.step) return x.step - y.step;
        if (x.group !== y.group) return (x.group ?? -1) - (y.group ?? -1);
        return adv(a, b);
      });
    } else if (state.sort !== "order") {
      view.sort(byKey(state.sort, sign));
    }
  };

  // --------------------------------------------------------------------------------- render
  const image = (index, alt) => {
    const src = has(index) ? IMAGES[index] : null;
    if (!src) return el("div", "noimage", has(index) ? "image not available" : "no image");
    const img = el("img");
    img.loading = "lazy";
    img.alt = alt;
    img.src = src;
    return img;
  };
  const scoreTable = (c) => {
    const table = el("table", "scores");
    const head = el("tr"), row = el("tr");
    const add = (label, value, title) => {
      const th = el("th", null, label);
      if (title) th.title = title;
      head.appendChild(th);
      row.appendChild(el("td", null, value));
    };
    add("b-CapScore", has(c.b_capscore) ? fmt(100 * c.b_capscore, 1) : "\u2013", "harmonic mean x100 (Appendix A)");
    add("precision", fmt(c.precision, 3));
    add("recall", fmt(c.recall, 3));
    const ling = has(c.linguistic) && c.masked ? fmt(c.linguistic, 3) + " (judge " + fmt(c.linguistic_raw, 3) + ")"
      : fmt(c.linguistic, 3);
    add("linguistic", ling);
    add("clarity / fluency / coherency", has(c.clarity) ? c.clarity + " / " + c.fluency + " / " + c.coherency : "\u2013");
    let lengthText = has(c.ratio) ? fmt(c.ratio, 2) + " (" + c.ratio_unit + ")" : "\u2013";
    if (c.in_band === false) lengthText += " outside band";
    add("length ratio \u03c1", lengthText);
    add("length mask", c.masked === true ? "applied: linguistic set to 0" : c.masked === false ? "not applied" : "none (no length control)");
    if (has(c.advantage)) add("advantage", fmt(c.advantage, 3));
    if (has(c.meta) && !c.ca) add("meta / halluc. share", fmt(c.meta, 2) + " / " + fmt(c.halluc, 2));
    table.appendChild(head);
    table.appendChild(row);
    return table;
  };
  const card = (i) => {
    const c = CARDS[i];
    const node = el("article", "card" + (grouped() && has(c.step) ? " grouped" : ""));
    node.dataset.index = String(i);
    if (!(grouped() && has(c.step))) {
      const thumb = el("div", "thumb");
      thumb.appendChild(image(c.image, c.id));
      node.appendChild(thumb);
    }
    const body = el("div", "body");
    let where = c.id + " \u00b7 " + DATA.sources[c.source];
    if (has(c.step)) where += " \u00b7 step " + c.step + " \u00b7 group " + c.group;
    const whereLine = el("div", "where", where);
    if (c.failure !== null) whereLine.appendChild(el("span", "badge failure", "judge failed: " + c.failure));
    if (c.masked === true) whereLine.appendChild(el("span", "badge masked", "length mask"));
    body.appendChild(whereLine);
    body.appendChild(el("p", "caption", c.caption));
    if (c.ca) {
      const ul = el("ul", "assertions");
      c.ca.forEach(([textIndex, code]) => {
        const text = STRINGS[textIndex];
        const status = STATUS[code];
        const known = status !== undefined;
        const li = el("li", known ? status : "unknown");
        li.title = known ? MARK_TITLES[status] : String(code);
        li.appendChild(el("span", "mark", known ? MARKS[status] : "?"));
        li.appendChild(document.createTextNode(text));
        ul.appendChild(li);
      });
      body.appendChild(ul);
    }
    if (has(c.reference) || c.ra) {
      const details = el("details", "reference");
      const covered = c.ra ? c.ra.filter((a) => a[1] === true).length : null;
      details.appendChild(el("summary", null, c.ra ? "reference: " + covered + " of " + c.ra.length +
        " assertions covered" : "reference"));
      if (has(c.reference)) details.appendChild(el("p", null, STRINGS[c.reference]));
      if (c.ra) {
        const ul = el("ul", "assertions");
        c.ra.forEach(([textIndex, isCovered]) => {
          const text = STRINGS[textIndex];
          const li = el("li", isCovered === true ? "covered" : "missed");
          li.title = isCovered === true ? "covered by the caption" : "missed by the caption";
          li.appendChild(el("span", "mark", isCovered === true ? "\u25cf" : "\u25cb"));
          li.appendChild(document.createTextNode(text));
          ul.appendChild(li);
        });
        details.appendChild(ul);
      }
      body.appendChild(details);
    }
    body.appendChild(scoreTable(c));
    if (c.failure !== null) body.appendChild(el("p", "failure-line", "judge failure: " + c.failure +
      (c.detail ? " \u2014 " + c.detail : "")));
    if (c.explanation) body.appendChild(el("p", "explanation", "judge: " + c.explanation));
    if (c.verdict_from === "oracle") body.appendChild(el("p", "note", "verdict re-derived by the synthetic oracle"));
    if (c.note) body.appendChild(el("p", "note", c.note));
    node.appendChild(body);
    return node;
  };
  const groupHeader = (c, members) => {
    const box = el("section", "group");
    box.appendChild(image(c.image, c.id));
    const text = el("div", "text");
    const advs = members.map((i) => CARDS[i].advantage).filter(has);
    text.appendChild(el("p", "where", "prompt " + c.id + " \u00b7 step " + c.step + " \u00b7 group " + c.group +
      " \u00b7 " + members.length + " rollouts" + (advs.length ? " \u00b7 advantage " + fmt(Math.min(...advs), 2) +
      " \u2026 " + fmt(Math.max(...advs), 2) : "")));
    if (has(c.reference)) text.appendChild(el("p", null, "reference: " + STRINGS[c.reference]));
    box.appendChild(text);
    return box;
  };

  let shown = 0;
  let lastGroup = null;
  const appendChunk = () => {
    const end = Math.min(view.length, shown + CHUNK);
    const fragment = document.createDocumentFragment();
    for (let k = shown; k < end; k++) {
      const i = view[k];
      const c = CARDS[i];
      if (grouped() && has(c.step)) {
        const key = c.source + "/" + c.step + "/" + c.group;
        if (key !== lastGroup) {
          lastGroup = key;
          let j = k;
          const members = [];
          while (j < view.length && CARDS[view[j]].source === c.source && CARDS[view[j]].step === c.step &&
            CARDS[view[j]].group === c.group) members.push(view[j++]);
          fragment.appendChild(groupHeader(c, members));
        }
      }
      fragment.appendChild(card(i));
    }
    list.appendChild(fragment);
    shown = end;
  };
  const render = () => {
    compute();
    list.replaceChildren();
    shown = 0;
    lastGroup = null;
    count.textContent = view.length + " of " + CARDS.length + " captions";
    count.dataset.matching = String(view.length);
    if (!view.length) list.appendChild(el("div", "empty", "No caption matches these filters."));
    appendChunk();
  };
  new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting) && shown < view.length) {
      appendChunk();
      // still in view after a chunk (tall screen): keep going on the next frame
      requestAnimationFrame(() => {
        const box = sentinel.getBoundingClientRect();
        if (box.top < innerHeight + 800 && shown < view.length) appendChunk();
      });
    }
  }, { rootMargin: "800px" }).observe(sentinel);

  const changed = () => {
    ["source", "step", "sort", "order", "failure"].forEach((k) => (state[k] = ctl[k].value));
    ["meta", "halluc", "masked"].forEach((k) => (state[k] = ctl[k].checked ? "1" : "0"));
    state.q = ctl.q.value;
    ctl.order.disabled = state.sort === "order";
    writeHash();
    render();
  };
  Object.keys(ctl).forEach((k) => ctl[k].addEventListener(k === "q" ? "input" : "change", changed));
  window.addEventListener("hashchange", () => {
    readHash();
    showState();
    render();
  });

  readHash();
  showState();
  render();
  // for benchmarks: when the script started, parsed the data and showed the first cards (ms since navigation)
  window.balcaprlInspect = { startMs: started, parsedMs: parsed, firstRenderMs: performance.now() };
  document.body.dataset.ready = "1";
})();
