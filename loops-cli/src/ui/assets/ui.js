// loops ui: refreshes the pages while runs progress, and asks before a write.
// Served as a file (the pages allow no inline script). A refresh fetches the HTML of a
// [data-live] element again and replaces each of its [data-part] children that changed;
// that HTML comes from the server, which escaped every stored value in it. What a user
// typed is only ever set as text.
"use strict";

(function () {
  const every = Number(document.body.dataset.every) || 1000;

  // Not while a confirmation is open, or the user is typing in the part.
  function busy(part) {
    if (document.querySelector("dialog[open]")) return true;
    const active = document.activeElement;
    return active !== null && part.contains(active) && active.matches("input, textarea, select");
  }

  // The server's last HTML of each part: a part is replaced only when that changes, so what
  // the page itself changed in a part (a message, a dialog's text) does not count.
  const seen = new Map();
  const key = (live, name) => live.dataset.live + "|" + name;
  for (const live of document.querySelectorAll("[data-live]")) {
    for (const part of live.querySelectorAll("[data-part]")) {
      seen.set(key(live, part.dataset.part), part.innerHTML);
    }
  }

  function replace(live, current, fresh) {
    const html = fresh.innerHTML;
    const name = key(live, fresh.dataset.part);
    if (seen.get(name) === html || busy(current)) return;
    const open = new Set();
    for (const d of current.querySelectorAll("details[open][data-key]")) open.add(d.dataset.key);
    for (const d of fresh.querySelectorAll("details[data-key]")) d.open = open.has(d.dataset.key);
    current.replaceWith(fresh);
    seen.set(name, html);
  }

  async function refresh() {
    if (!document.hidden) {
      for (const live of document.querySelectorAll("[data-live]")) {
        try {
          const answer = await fetch(live.dataset.live, { cache: "no-store" });
          const text = await answer.text();
          document.body.classList.toggle("offline", !answer.ok);
          if (!answer.ok) continue;
          const doc = new DOMParser().parseFromString(text, "text/html");
          for (const fresh of doc.querySelectorAll("[data-part]")) {
            const current = live.querySelector('[data-part="' + fresh.dataset.part + '"]');
            if (current) replace(live, current, document.adoptNode(fresh));
          }
        } catch (_) {
          document.body.classList.toggle("offline", true);
        }
      }
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);

  // A button with data-confirm checks its form and opens the form's dialog; the dialog's
  // submit button sends the form, its data-close button closes it.
  document.addEventListener("click", function (event) {
    const opener = event.target.closest("[data-confirm]");
    if (opener) {
      const form = opener.form;
      const payload = form.elements.namedItem("payload");
      const problem = form.querySelector(".json-error");
      if (payload) {
        try {
          JSON.parse(payload.value);
          payload.setCustomValidity("");
          if (problem) problem.textContent = "";
        } catch (e) {
          payload.setCustomValidity("not valid JSON");
          if (problem) problem.textContent = "The payload is not valid JSON: " + e.message;
          return;
        }
      }
      if (!form.reportValidity()) return;
      for (const fill of form.querySelectorAll("[data-fill]")) {
        const field = form.elements.namedItem(fill.dataset.fill);
        fill.textContent = field ? field.value : "";
      }
      form.querySelector("dialog").showModal();
      return;
    }
    const close = event.target.closest("[data-close]");
    if (close) close.closest("dialog").close();
  });
})();
