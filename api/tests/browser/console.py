"""Drives headless Chromium (Debian's chromium and chromium-driver, through Selenium) through the console that the
service serves at /console. Usage: console.py BASE_URL TOKEN [SCREENSHOT_DIR]. It signs in with TOKEN and goes
through every view, printing one line per step for the test to check; between steps it reads a line on standard
input when the test must make something happen through the API first:

  fleet NODES              the fleet view lists NODES nodes (their rows); then reads `cordoned NODE_ID` and prints
                           `saw cordoned` once that node's row says so, without a reload
  reserved RSV_ID POOL_ID  a reservation made through the console's form, whose detail lists its events
  events N                 the detail lists N events with their admission context
  calendar RSV_ID          the pool's calendar shows a bar of that reservation; then reads `booking RSV_ID` and
                           prints `saw booking RSV_ID` once that bar appears, without a reload
  ended STATE              the reservation list's cancel (or release) button ended that booking
  audit N                  the audit view lists N entries
  node SECTIONS            a node's detail shows its inventory's sections and its commands
It exits 0 at the end, 1 on a timeout (printing the page's text). With SCREENSHOT_DIR it saves each view as a PNG
there: fleet, reservation, calendar, reservations, audit, node."""

import os
import sys

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT_SECONDS = 60


def main() -> int:
    base, token = sys.argv[1], sys.argv[2]
    shots = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--ignore-certificate-errors", "--window-size=1500,900", "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    # The views redraw on every event, so an element found a moment ago may be gone: look again.
    wait = WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,))

    def all_of(selector):
        return driver.find_elements(By.CSS_SELECTOR, selector)

    def one(selector):
        return wait.until(lambda _: (all_of(selector) or [None])[0])

    def text_of(selector):
        return driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", selector)

    def click(selector):
        def attempt(_):
            found = all_of(selector)
            if found:
                found[0].click()
            return bool(found)
        wait.until(attempt)

    def say(line):
        print(line, flush=True)

    def hear(expected):
        line = sys.stdin.readline().strip()
        command, _, argument = line.partition(" ")
        if command != expected:
            raise SystemExit(f"the test said {line!r}, not {expected}")
        return argument

    def shot(name):
        if not shots:
            return
        # The whole page, up to a height that stays readable.
        driver.execute_script("window.scrollTo(0, 0)")
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        metrics = {"width": 1500, "height": max(900, min(height, 2400)), "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        driver.save_screenshot(os.path.join(shots, f"{name}.png"))
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    def errors():
        return [e.text for e in all_of("main .error") if e.text]

    def go(hash_):
        driver.execute_script("location.hash = arguments[0]", hash_)

    try:
        driver.get(f"{base}/console/")
        one("#sign-in #token").send_keys(token)
        click("#sign-in button[type=submit]")
        wait.until(lambda _: all_of("#fleet tr[data-node]"))
        # A marker that a reload would clear: every later step checks the page was never reloaded.
        driver.execute_script("window.consoleMarker = 'kept'")
        wait.until(lambda _: driver.execute_script("return document.body.dataset.streamOpen") == "1")
        say(f"fleet {len(all_of('#fleet tr[data-node]'))}")
        shot("fleet")

        node = hear("cordoned")
        wait.until(lambda _: "cordoned" in text_of(f"#fleet tr[data-node='{node}'] td.cordoned"))
        say("saw cordoned")

        go("#/reservations")
        form = one("form#reserve")
        pool = Select(form.find_element(By.ID, "new-pool"))
        pool.select_by_index(0)
        pool_id = pool.first_selected_option.get_attribute("value")
        count = form.find_element(By.ID, "new-count")
        count.clear()
        count.send_keys("2")
        hours = form.find_element(By.ID, "new-hours")
        hours.clear()
        hours.send_keys("3")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda _: "#/reservations/rsv_" in driver.current_url)
        rsv = driver.current_url.rsplit("/", 1)[1]
        wait.until(lambda _: len(all_of("#reservation-events tbody tr")) >= 2)
        say(f"reserved {rsv} {pool_id}")
        # Its binding and activation follow as the agents confirm: shown as they come.
        wait.until(lambda _: all_of("#reservation-events tr[data-type='reservation.activated']"))
        wait.until(lambda _: text_of("#reservation-summary .badge") == "active")
        say(f"events {len(all_of('#reservation-events tbody tr'))}")
        shot("reservation")

        go(f"#/pools/{pool_id}/calendar")
        one(f"#calendar rect[data-reservation='{rsv}']")
        say(f"calendar {rsv}")
        other = hear("booking")
        one(f"#calendar rect[data-reservation='{other}']")
        assert driver.execute_script("return window.consoleMarker") == "kept", "the page was reloaded"
        say(f"saw booking {other}")
        earliest = one("form#earliest")
        earliest_count = earliest.find_element(By.ID, "earliest-count")
        earliest_count.clear()
        earliest_count.send_keys("8")
        click("form#earliest button[type=submit]")
        wait.until(lambda _: text_of("#earliest-answer").strip())
        shot("calendar")

        go("#/reservations")
        row = f"#reservation-list tr[data-reservation='{other}']"
        click(f"{row} button[data-action]")
        wait.until(lambda _: text_of(f"{row} .badge") in ("cancelled", "released", "releasing"))
        say(f"ended {text_of(f'{row} .badge')}")
        shot("reservations")

        go("#/audit")
        wait.until(lambda _: all_of("#audit-table tbody tr"))
        say(f"audit {len(all_of('#audit-table tbody tr'))}")
        shot("audit")

        go(f"#/nodes/{node}")
        wait.until(lambda _: all_of("#inventory [data-section]") and all_of("#node h1"))
        sections = sorted(set(driver.execute_script(
            "return [...document.querySelectorAll('#inventory [data-section]')].map((e) => e.dataset.section)")))
        say(f"node {','.join(sections)}")
        shot("node")
        assert driver.execute_script("return window.consoleMarker") == "kept", "the page was reloaded"

        # The demo customer signs in on the same page: it sees only what is its own or offered to it.
        if len(sys.argv) > 4 and sys.argv[4]:
            click("#sign-out")
            one("#sign-in #token").send_keys(sys.argv[4])
            click("#sign-in button[type=submit]")
            wait.until(lambda _: all_of("#fleet tr[data-pool]"))
            pools = len(all_of("#fleet tr[data-pool]"))
            nodes = len(all_of("#fleet tr[data-node]"))
            go("#/reservations")
            wait.until(lambda _: one("#reservation-list").text.strip())
            theirs = sorted(set(driver.execute_script(
                "return [...document.querySelectorAll('#reservation-list tr[data-reservation]')]"
                ".map((e) => e.dataset.reservation)")))
            go("#/audit")
            wait.until(lambda _: "entries" in text_of("#audit-list"))
            audited = text_of("#audit-list")
            fed = driver.execute_script("return document.getElementById('events').innerText")
            say(f"tenant pools {pools} nodes {nodes} reservations {','.join(theirs) or '-'} "
                f"audit-mentions-admin {'yes' if rsv in audited or node in audited else 'no'} "
                f"feed-mentions-admin {'yes' if rsv[:12] in fed or node[:12] in fed else 'no'}")
        return 0
    except TimeoutException:
        text = driver.execute_script("return document.body.innerText")
        html = driver.execute_script("return document.body.outerHTML")[:3000]
        print(f"timeout at {driver.current_url}: errors {errors()!r}, page:\n{text}\n{html}".replace("\n", " | "),
              flush=True)
        return 1
    finally:
        driver.quit()


if __name__ == "__main__":
    sys.exit(main())
