// Gateway dashboard: the only script. Pages work without it; it adds
//  - live pairing on /instances/{id}/manage: polls status.json every 2 s, swaps the QR
//    when it changes, shows the connection state, asks for a fresh QR when it is old,
//    and reloads once when the phone connects or disconnects;
//  - the CSV import and the policy-module upload: a file chosen is read into the form's
//    text field (as base64 for a module; the form itself stays
//    application/x-www-form-urlencoded);
//  - the invitation page: copies the code from the link's #fragment into the form
//    (the code never reaches the server's logs, which record paths and queries).
"use strict";
(function () {
  function livePairing(box) {
    var url = box.getAttribute("data-status-url");
    var pairUrl = box.getAttribute("data-pair-url");
    var csrf = box.getAttribute("data-csrf");
    var img = box.querySelector("img.qr-image");
    var state = box.querySelector("[data-state]");
    var lastQr = img ? img.getAttribute("src") : "";
    var shown = state ? state.getAttribute("data-state") : "";
    var refreshing = false;
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.json(); })
        .then(function (s) {
          if (state) { state.textContent = s.lifecycle_label; state.setAttribute("data-state", s.lifecycle); }
          // A change of connection changes the page's buttons: show the new page once.
          if (s.lifecycle !== shown && (s.lifecycle === "connected" || shown === "connected")) {
            window.location.reload();
            return;
          }
          if (img && s.qr && s.qr !== lastQr) { img.setAttribute("src", s.qr); lastQr = s.qr; }
          if (s.lifecycle === "qr_pending" && s.qr_age_seconds > 45 && !refreshing && pairUrl && csrf) {
            refreshing = true;
            var body = new URLSearchParams(); body.set("csrf", csrf); body.set("quiet", "1");
            fetch(pairUrl, { method: "POST", credentials: "same-origin", body: body })
              .finally(function () { refreshing = false; });
          }
        })
        .catch(function () { /* try again on the next tick */ });
    }
    setInterval(tick, 2000);
    tick();
  }
  function inviteCode() {
    var field = document.getElementById("invite-token");
    if (field && window.location.hash.length > 1) {
      field.value = decodeURIComponent(window.location.hash.slice(1));
      history.replaceState(null, "", window.location.pathname);
    }
  }
  function fileFill(input) {
    var target = document.getElementById(input.getAttribute("data-fill"));
    input.hidden = false;
    var hints = document.querySelectorAll(".js-only");
    for (var i = 0; i < hints.length; i++) { hints[i].hidden = false; }
    input.addEventListener("change", function () {
      var file = input.files && input.files[0];
      if (!file || !target) { return; }
      var reader = new FileReader();
      if (input.getAttribute("data-encoding") === "base64") {
        // A binary file (a policy module): its bytes as base64, without the data: prefix.
        reader.onload = function () { target.value = String(reader.result).replace(/^data:[^,]*,/, ""); };
        reader.readAsDataURL(file);
      } else {
        reader.onload = function () { target.value = String(reader.result); };
        reader.readAsText(file);
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var files = document.querySelectorAll("input[type=file][data-fill]");
    for (var j = 0; j < files.length; j++) { fileFill(files[j]); }
    var boxes = document.querySelectorAll("[data-status-url]");
    for (var i = 0; i < boxes.length; i++) { livePairing(boxes[i]); }
    inviteCode();
  });
})();
