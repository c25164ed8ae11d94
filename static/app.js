// Small UI behaviour on top of htmx: autoscroll, textarea auto-grow, keyboard, copy buttons,
// a preset's model shown in the picker, and focus kept where a keyboard user expects it.
// Nothing here is needed to read a chat or post a message; without it the forms still work
// (the Copy buttons of messages and replies stay hidden: they need this file to do anything).
(function () {
  "use strict";

  var STICK_PX = 80; // "at the bottom" tolerance: scrolling up further pauses autoscroll
  var MENUS = "details.more-menu[open], details.chat-menu[open]";
  var stick = true;

  function messages() { return document.getElementById("conversation"); }

  function atBottom(el) {
    return el.scrollHeight - el.scrollTop - el.clientHeight < STICK_PX;
  }

  function scrollDown(force) {
    var el = messages();
    if (el && (stick || force)) { el.scrollTop = el.scrollHeight; }
  }

  function grow(area) {
    area.style.height = "auto";
    area.style.height = area.scrollHeight + 2 + "px";
  }

  function growAll(root) {
    var areas = (root || document).querySelectorAll("textarea[data-autogrow]");
    for (var i = 0; i < areas.length; i++) { grow(areas[i]); }
  }

  function copyText(text, button) {
    var label = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", label);
    function done(ok) {
      button.textContent = ok ? "Copied" : "Copy failed";
      setTimeout(function () { button.textContent = label; }, 1500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(false); });
      return;
    }
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "copy-buffer";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    done(ok);
  }

  function setAlert(text) {
    var alert = document.getElementById("composer-alert");
    if (alert) { alert.textContent = text; }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var el = messages();
    if (el) {
      el.addEventListener("scroll", function () { stick = atBottom(el); }, { passive: true });
    }
    growAll(document);
    revealCopyButtons(document);
    scrollDown(true);
  });

  document.addEventListener("input", function (event) {
    var t = event.target;
    if (t instanceof HTMLTextAreaElement && t.hasAttribute("data-autogrow")) { grow(t); }
  });

  document.addEventListener("keydown", function (event) {
    var t = event.target;
    if (event.key === "Enter" && !event.shiftKey && !event.altKey && !event.ctrlKey &&
        !event.metaKey && !event.isComposing && t instanceof HTMLTextAreaElement &&
        t.hasAttribute("data-enter-sends") && t.form) {
      event.preventDefault();
      t.form.requestSubmit();
      return;
    }
    // Ctrl+K (Cmd+K on macOS) jumps to the search box; preventDefault keeps the
    // browser's own Ctrl+K (focus its address bar's search) from firing as well.
    if ((event.ctrlKey || event.metaKey) && !event.altKey && !event.shiftKey &&
        (event.key === "k" || event.key === "K")) {
      var box = document.getElementById("search-box");
      if (box) { event.preventDefault(); box.focus(); box.select(); }
      return;
    }
    if (event.key === "Escape") {
      // An open menu (More, Chat options) closes first, and its summary takes the focus.
      var menu = t instanceof Element ? t.closest(MENUS) : null;
      var summary = menu ? menu.querySelector(":scope > summary") : null;
      if (summary) {
        event.preventDefault();
        menu.open = false;
        summary.focus();
        return;
      }
      var stop = document.querySelector("form.stop-form button");
      if (stop) { event.preventDefault(); stop.click(); }
    }
  });

  // What a Copy button copies: a code block's code, a reply's Markdown source (kept in a
  // <template> so it is never rendered) or a user message's text as typed.
  function copySource(button) {
    if (button.hasAttribute("data-copy-code")) {
      var block = button.closest(".codeblock");
      return block ? block.querySelector("pre code") : null;
    }
    var message = button.closest("[data-role=assistant], [data-role=user]");
    if (!message) { return null; }
    // Direct children only: nothing inside the rendered text can stand in for them.
    var source = message.querySelector(":scope > template.reply-source");
    return source ? source.content : message.querySelector(":scope > .content");
  }

  function revealCopyButtons(root) {
    var buttons = root.querySelectorAll("button[data-copy][hidden]");
    for (var i = 0; i < buttons.length; i++) { buttons[i].hidden = false; }
  }

  document.addEventListener("click", function (event) {
    var link = event.target instanceof Element ? event.target.closest("[data-copy-link]") : null;
    var box = link ? document.getElementById(link.getAttribute("data-copy-link")) : null;
    if (box) { copyText(box.value, link); return; }
    var button = event.target instanceof Element
      ? event.target.closest("[data-copy-code], [data-copy]") : null;
    var source = button ? copySource(button) : null;
    if (source) { copyText(source.textContent || "", button); }
  });

  // A select that saves itself (a chat's Project): its Move button stays for no JavaScript.
  document.addEventListener("change", function (event) {
    var select = event.target instanceof Element ? event.target.closest("select[data-autosubmit]") : null;
    if (select && select.form) { select.form.requestSubmit(); }
  });

  // A message just sent: follow the reply from the bottom again.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (elt && elt.id === "composer") { stick = true; }
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    growAll(event.target instanceof Element ? event.target : document);
    scrollDown(false);
  });

  // Older messages arrive above the ones being read: keep those where they were, so
  // the next page loads only when the user scrolls up to it.
  var heightBefore = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail && event.detail.target;
    var el = messages();
    if (el && target instanceof Element && target.classList.contains("earlier")) {
      heightBefore = el.scrollHeight;
    }
  });
  document.addEventListener("htmx:afterSwap", function () {
    var el = messages();
    if (el && heightBefore !== null) {
      el.scrollTop += el.scrollHeight - heightBefore;
      heightBefore = null;
    }
  });

  // New content from any swap (a request, an out-of-band part, an SSE event such as a
  // finished reply replacing its streaming element): its Copy buttons can work now.
  document.addEventListener("htmx:load", function (event) {
    if (event.target instanceof Element) { revealCopyButtons(event.target); }
  });

  // Streamed text does not settle like a request: follow it as it arrives.
  document.addEventListener("htmx:sseMessage", function () { scrollDown(false); });

  // A preset chosen on the new-chat page shows its model in the Model select (the preset
  // sets it anyway when the message is sent).
  document.addEventListener("change", function (event) {
    var t = event.target;
    if (!(t instanceof HTMLSelectElement) || !t.hasAttribute("data-preset-select")) { return; }
    var option = t.selectedOptions[0];
    var name = option ? option.getAttribute("data-model") : null;
    var picker = document.getElementById("model-select");
    if (picker && name) { picker.value = name; }
  });

  // --- Focus is never lost (SPEC §18) ----------------------------------------------
  // Most actions swap out the very control that was pressed, and the browser then puts
  // focus on <body>. Before a request made from the focused control we note where focus
  // belongs once its answer is in (a function that finds that element); after the swap
  // settles, and only if focus was really lost (not if the person has moved on, to the
  // message box say), it goes there. A message element is made focusable (tabindex -1)
  // only when it is focused.

  function focusOn(el) {
    if (!(el instanceof HTMLElement)) { return; }
    if (!el.matches("a[href], button, input, select, textarea, summary, [tabindex]")) {
      el.setAttribute("tabindex", "-1");
    }
    el.focus();
  }

  function focusLost() {
    var active = document.activeElement;
    return !active || active === document.body || !active.isConnected;
  }

  function byId(id) { return id ? document.getElementById(id) : null; }

  function nameOf(button) {
    return button ? (button.getAttribute("aria-label") || button.textContent || "").trim() : "";
  }

  function buttonNamed(scope, name) {
    var buttons = scope ? scope.querySelectorAll("button") : [];
    for (var i = 0; i < buttons.length; i++) {
      if (nameOf(buttons[i]) === name) { return buttons[i]; }
    }
    return null;
  }

  function lastReply() {
    var all = document.querySelectorAll("#messages [data-role=assistant]");
    return all.length ? all[all.length - 1] : null;
  }

  // Previous / Next version: the same button in the version now shown, or the other one
  // when it is disabled there (at either end). The version shown is the element of the
  // run the form asked for; failing that, the switcher at the same place on the page.
  function versionTarget(elt, message) {
    var pressed = nameOf(elt.querySelector("button"));
    var input = elt.querySelector("input[name=run_id]");
    var prefix = message && message.getAttribute("data-role") === "user" ? "msg-" : "reply-";
    var groups = Array.prototype.slice.call(document.querySelectorAll("#messages .versions"));
    var place = groups.indexOf(elt.closest(".versions"));
    return function () {
      var shown = byId(input ? prefix + input.value : null);
      var group = shown ? shown.querySelector(".versions")
        : document.querySelectorAll("#messages .versions")[place];
      var same = buttonNamed(group, pressed);
      var other = buttonNamed(group, pressed === "Next version" ? "Previous version" : "Next version");
      return same && !same.disabled ? same : other;
    };
  }

  // Where focus goes after the request `elt` (a form, the Cancel button, the link to
  // earlier messages) is answered.
  function focusTarget(elt) {
    var message = elt.closest("[data-role=user], [data-role=assistant]");
    var id = message ? message.id : null;
    if (elt.closest(".versions")) { return versionTarget(elt, message); }
    // Load earlier messages: the link to the page before that one, or the oldest message.
    if (elt.closest(".earlier")) {
      return function () {
        return document.querySelector("#messages .earlier a") ||
          document.querySelector("#messages [data-role=user], #messages [data-role=assistant]");
      };
    }
    if (elt.matches("form.edit-form")) { return lastReply; } // Save and send: the new reply
    var name = nameOf(elt instanceof HTMLButtonElement ? elt : elt.querySelector("button"));
    if (name === "Edit") {
      var runId = message ? message.getAttribute("data-message-id") : null;
      return function () { return byId("edit-" + runId); };
    }
    if (name === "Cancel") { return function () { return buttonNamed(byId(id), "Edit"); }; }
    if (name === "Regenerate") { return lastReply; }
    // Stop, Continue, Allow, Always allow, Deny: the reply itself, as it now is.
    if (message && message.getAttribute("data-role") === "assistant") {
      return function () { return byId(id); };
    }
    return null;
  }

  var pendingFocus = null; // {elt, find, swapped}
  var refocusId = null; // a streaming reply that had focus when its final version came

  // The element that made a request: htmx dispatches its request events on it.
  function requestElt(event) {
    var detail = event.detail || {};
    return (detail.requestConfig && detail.requestConfig.elt) || detail.elt || event.target;
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = requestElt(event);
    // Only an action whose control has focus: a page of earlier messages loaded because
    // someone scrolled up must not pull the view to a focused element.
    if (!(elt instanceof Element) || !elt.closest("#messages") ||
        !elt.contains(document.activeElement)) { return; }
    var find = focusTarget(elt);
    // Other requests (the usage total's refresh, search) leave a pending plan alone.
    if (find) { pendingFocus = { elt: elt, find: find, swapped: false }; }
  });

  // The conversation is a live region for replies that complete (SPEC §18). A request
  // redraws it whole (send, edit, switch...) or inserts older pages: those are not news,
  // so the region is quiet while they go in, and polite again once they are drawn.
  var quiet = false;
  var quietFallback = null;
  function politeAgain() {
    clearTimeout(quietFallback);
    var region = document.getElementById("messages");
    if (region) { region.setAttribute("aria-live", "polite"); }
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var detail = event.detail || {};
    if (pendingFocus && requestElt(event) === pendingFocus.elt) { pendingFocus.swapped = true; }
    var region = document.getElementById("messages");
    var target = detail.target;
    if (region && detail.shouldSwap && target instanceof Element &&
        (target === region || region.contains(target))) {
      region.setAttribute("aria-live", "off");
      quiet = true;
      clearTimeout(quietFallback);
      quietFallback = setTimeout(politeAgain, 2000); // in case nothing settles
    }
  });

  // The final version of a streaming reply replaces its element (an SSE event): focus
  // on it, or in it, goes to its successor.
  document.addEventListener("htmx:sseBeforeMessage", function (event) {
    var reply = event.target instanceof Element
      ? event.target.closest("[data-role=assistant]") : null;
    refocusId = reply && reply.contains(document.activeElement) ? reply.id : null;
  });

  // At settle, not at swap: htmx gives new content its behaviour (hx-get on the Cancel
  // button, say) only then, and a key pressed on it before would submit the plain form.
  document.addEventListener("htmx:afterSettle", function (event) {
    if (quiet) {
      quiet = false;
      // Two frames on: the accessibility tree has taken the swap in while it was off.
      requestAnimationFrame(function () { requestAnimationFrame(politeAgain); });
    }
    // Only this request's own settle: another swap (the usage total's) may settle first.
    if (pendingFocus && pendingFocus.swapped && requestElt(event) === pendingFocus.elt) {
      var find = pendingFocus.find;
      pendingFocus = null;
      if (focusLost()) { focusOn(find()); }
    }
    if (refocusId !== null && event.target instanceof Element && event.target.id === refocusId) {
      refocusId = null;
      if (focusLost()) { focusOn(event.target); }
    }
  });

  // Files dropped on a message box, or pasted into it, join its form's Attach files input
  // (the form sends them as it sends a chosen file; without JavaScript, choose them there).
  function attachTo(area, files) {
    var form = area.closest("form");
    var input = form ? form.querySelector("input[type=file][data-attach]") : null;
    if (!input || !files || !files.length || typeof DataTransfer === "undefined") { return false; }
    var all = new DataTransfer();
    Array.prototype.forEach.call(input.files, function (f) { all.items.add(f); });
    Array.prototype.forEach.call(files, function (f) { all.items.add(f); });
    input.files = all.files;
    return true;
  }
  document.addEventListener("dragover", function (event) {
    if (event.target instanceof HTMLTextAreaElement && event.dataTransfer &&
        Array.prototype.indexOf.call(event.dataTransfer.types, "Files") >= 0) {
      event.preventDefault();
    }
  });
  document.addEventListener("drop", function (event) {
    var t = event.target;
    if (t instanceof HTMLTextAreaElement && event.dataTransfer &&
        attachTo(t, event.dataTransfer.files)) {
      event.preventDefault();
    }
  });
  document.addEventListener("paste", function (event) {
    var t = event.target;
    if (t instanceof HTMLTextAreaElement && event.clipboardData &&
        event.clipboardData.files.length && attachTo(t, event.clipboardData.files)) {
      event.preventDefault();  // a pasted image is attached, not pasted as its name
    }
  });

  // A message sent takes its files with it: the next one starts with none.
  document.addEventListener("htmx:afterRequest", function (event) {
    var form = event.detail && event.detail.elt;
    if (!(form instanceof HTMLFormElement) || !event.detail.successful) { return; }
    form.querySelectorAll("input[type=file][data-attach]").forEach(function (input) {
      input.value = "";
    });
  });

  document.addEventListener("htmx:sendError", function () {
    setAlert("The server could not be reached. Your text is still in the box; try again.");
  });
})();
