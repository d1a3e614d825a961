"""Drives headless Chromium (Debian's chromium and chromium-driver, through Selenium) on the page that follows
the event stream. Usage: follow.py PAGE_URL. It prints `open` once the page's EventSource is connected, then for
each line `expect TEXT` on standard input waits until the page has received an event containing TEXT and prints
`saw TEXT`; `reopened N` waits until the EventSource has connected N times. It exits 0 on `quit`, 1 on a
timeout (printing what the page holds)."""

import sys

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

WAIT_SECONDS = 60


def main() -> int:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--ignore-certificate-errors"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    wait = WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.05)

    def opened() -> int:
        return int(driver.execute_script("return Number(document.body.dataset.open)"))

    def received() -> str:
        return driver.execute_script("return document.getElementById('log').innerText")

    try:
        driver.get(sys.argv[1])
        wait.until(lambda _: opened() >= 1)
        print("open", flush=True)
        for line in sys.stdin:
            command, _, argument = line.strip().partition(" ")
            if command == "expect":
                wait.until(lambda _: argument in received())
                print(f"saw {argument}", flush=True)
            elif command == "reopened":
                wait.until(lambda _: opened() >= int(argument))
                print(f"reopened {argument}", flush=True)
            elif command == "quit":
                return 0
        return 0
    except TimeoutException:
        error = driver.execute_script("return document.body.dataset.error || ''")
        print(f"timeout: opened {opened()} times, error {error!r}, received:\n{received()}", flush=True)
        return 1
    finally:
        driver.quit()


if __name__ == "__main__":
    sys.exit(main())
