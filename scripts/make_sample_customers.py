"""Write ``helpers/sample_data/customers.csv``: the bundled sample for the text notebook.

The columns follow Ray's tutorial's 2-million-row synthetic customers file, plus ``Industry``,
the true label. Companies are real, well-known organisations, 34 per label; the people, phones,
cities and dates are synthetic (seeded, so the file is reproducible: a test regenerates it and
fails if the committed copy drifts). Three deliberately bad rows show the reject and error paths:
two with no company, one with a 60,000-character company name that no prompt budget can hold.

Run: ``python scripts/make_sample_customers.py`` (``--check`` compares instead of writing).
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "helpers" / "sample_data" / "customers.csv"
COLUMNS = ["Index", "Customer Id", "First Name", "Last Name", "Company", "City", "Country",
           "Phone 1", "Phone 2", "Email", "Subscription Date", "Website", "Industry"]

COMPANIES: dict[str, list[str]] = {
    "Law Firm": [
        "Baker McKenzie", "Kirkland & Ellis", "Latham & Watkins", "DLA Piper", "Dentons",
        "Skadden, Arps, Slate, Meagher & Flom", "Clifford Chance", "Allen & Overy",
        "Freshfields Bruckhaus Deringer", "Linklaters", "Sidley Austin", "White & Case", "Jones Day",
        "Hogan Lovells", "Norton Rose Fulbright", "Sullivan & Cromwell", "Cravath, Swaine & Moore",
        "Wachtell, Lipton, Rosen & Katz", "Davis Polk & Wardwell", "Simpson Thacher & Bartlett",
        "Gibson, Dunn & Crutcher", "Ropes & Gray", "Morgan, Lewis & Bockius", "Paul, Weiss",
        "Cleary Gottlieb Steen & Hamilton", "Quinn Emanuel Urquhart & Sullivan",
        "Weil, Gotshal & Manges", "Covington & Burling", "Milbank", "Slaughter and May",
        "Herbert Smith Freehills", "Mayer Brown", "King & Spalding", "Debevoise & Plimpton",
    ],
    "Healthcare": [
        "Mayo Clinic", "Cleveland Clinic", "Kaiser Permanente", "HCA Healthcare", "UnitedHealth Group",
        "Johns Hopkins Hospital", "Massachusetts General Hospital", "Pfizer", "Johnson & Johnson",
        "Merck & Co.", "Novartis", "Roche", "AstraZeneca", "GSK", "Sanofi", "Eli Lilly and Company",
        "AbbVie", "Bristol Myers Squibb", "Medtronic", "CVS Health", "Cigna", "Humana",
        "Elevance Health", "Fresenius Medical Care", "Quest Diagnostics", "Labcorp",
        "Tenet Healthcare", "Ascension", "Providence Health", "Moderna", "Stryker",
        "Baxter International", "Boston Scientific", "Memorial Sloan Kettering Cancer Center",
    ],
    "Technology": [
        "Apple", "Microsoft", "Google", "Meta Platforms", "NVIDIA", "Intel", "IBM", "Oracle",
        "Salesforce", "Adobe", "Cisco Systems", "SAP", "Samsung Electronics", "Dell Technologies",
        "HP Inc.", "Qualcomm", "Advanced Micro Devices", "Spotify", "Dropbox", "Atlassian",
        "ServiceNow", "Shopify", "Zoom Video Communications", "Palantir Technologies", "Snowflake",
        "OpenAI", "Red Hat", "VMware", "Workday", "Twilio", "Autodesk", "Broadcom", "Infosys",
        "Anthropic",
    ],
    "Retail": [
        "Walmart", "Target", "Costco Wholesale", "Kroger", "The Home Depot", "Lowe's", "Best Buy",
        "Tesco", "Carrefour", "Aldi", "Lidl", "IKEA", "Macy's", "Nordstrom", "Kohl's", "Walgreens",
        "Sainsbury's", "Marks & Spencer", "Zara", "H&M", "Gap Inc.", "TJX Companies",
        "Dollar General", "Safeway", "Publix Super Markets", "Albertsons", "Sephora", "Ulta Beauty",
        "Uniqlo", "Primark", "Trader Joe's", "Whole Foods Market", "7-Eleven", "Dick's Sporting Goods",
    ],
    "Consulting": [
        "McKinsey & Company", "Boston Consulting Group", "Bain & Company", "Accenture", "Deloitte",
        "KPMG", "EY", "PwC", "Oliver Wyman", "Kearney", "Roland Berger", "Booz Allen Hamilton",
        "Capgemini", "Alvarez & Marsal", "FTI Consulting", "Huron Consulting Group",
        "L.E.K. Consulting", "Strategy&", "Arthur D. Little", "Gartner", "Mercer", "Korn Ferry",
        "Simon-Kucher & Partners", "ZS Associates", "Protiviti", "Slalom", "Guidehouse",
        "West Monroe", "North Highland", "Cornerstone Research", "Analysis Group",
        "Charles River Associates", "Willis Towers Watson", "Eden McCallum",
    ],
    "Manufacturing": [
        "Toyota", "General Motors", "Ford Motor Company", "Boeing", "Caterpillar", "3M",
        "General Electric", "Siemens", "Honeywell", "Bosch", "Volkswagen", "BMW", "Airbus",
        "Lockheed Martin", "John Deere", "Whirlpool", "Procter & Gamble", "Dow Chemical", "BASF",
        "DuPont", "Nucor", "ArcelorMittal", "Komatsu", "ABB", "Schneider Electric", "Emerson Electric",
        "Parker Hannifin", "Cummins", "Illinois Tool Works", "Eaton", "Kimberly-Clark",
        "Rolls-Royce Holdings", "Hyundai Motor Company", "Stanley Black & Decker",
    ],
    "Finance": [
        "JPMorgan Chase", "Goldman Sachs", "Morgan Stanley", "Bank of America", "Citigroup",
        "Wells Fargo", "BlackRock", "Vanguard", "Fidelity Investments", "Charles Schwab", "HSBC",
        "Barclays", "Deutsche Bank", "UBS", "BNP Paribas", "American Express", "Visa", "Mastercard",
        "State Street", "Capital One", "Santander", "ING Group", "Nomura", "Mizuho Financial Group",
        "Credit Agricole", "Lloyds Banking Group", "Royal Bank of Canada", "TD Bank", "KKR",
        "Blackstone", "Citadel", "Bridgewater Associates", "PayPal", "Berkshire Hathaway",
    ],
    "Real Estate": [
        "CBRE Group", "Jones Lang LaSalle", "Cushman & Wakefield", "Colliers International",
        "Prologis", "Simon Property Group", "Brookfield Properties", "Zillow", "Redfin",
        "Compass Real Estate", "Keller Williams", "RE/MAX", "Coldwell Banker",
        "Sotheby's International Realty", "Century 21", "Equity Residential",
        "AvalonBay Communities", "Boston Properties", "Vornado Realty Trust", "Public Storage",
        "Realty Income", "Hines", "Tishman Speyer", "Related Companies", "Savills", "Knight Frank",
        "Landsec", "British Land", "Vonovia", "Unibail-Rodamco-Westfield", "Douglas Elliman",
        "Howard Hughes Holdings", "Kimco Realty", "Marcus & Millichap",
    ],
    "Other": [
        "Delta Air Lines", "American Airlines", "Marriott International", "Hilton", "ExxonMobil",
        "Shell", "BP", "Chevron", "Verizon", "AT&T", "Vodafone", "Comcast", "The Walt Disney Company",
        "Netflix", "Warner Bros. Discovery", "FedEx", "UPS", "Maersk", "Harvard University",
        "Stanford University", "American Red Cross", "UNICEF", "Wikimedia Foundation",
        "Manchester United", "New York Yankees", "FIFA", "BBC", "The New York Times", "Duke Energy",
        "NextEra Energy", "Union Pacific", "Deutsche Telekom", "Emirates", "Hyatt",
    ],
}

FIRST = ["Ava", "Liam", "Noah", "Emma", "Olivia", "Mateo", "Sofia", "Lucas", "Mia", "Arjun", "Yuki",
         "Chen", "Fatima", "Omar", "Ines", "Lars", "Zoe", "Kwame", "Priya", "Diego", "Hana", "Ivan"]
LAST = ["Smith", "Garcia", "Müller", "Rossi", "Nguyen", "Kim", "Okafor", "Silva", "Novak", "Haddad",
        "Johansson", "Tanaka", "Patel", "Dubois", "Kowalski", "Brown", "Cohen", "Moreau", "Singh"]
PLACES = [("London", "United Kingdom"), ("New York", "United States"), ("Paris", "France"),
          ("Berlin", "Germany"), ("Tokyo", "Japan"), ("São Paulo", "Brazil"), ("Lagos", "Nigeria"),
          ("Mumbai", "India"), ("Toronto", "Canada"), ("Sydney", "Australia"), ("Madrid", "Spain"),
          ("Seoul", "South Korea"), ("Stockholm", "Sweden"), ("Mexico City", "Mexico")]
BAD_ROWS = [("", ""), ("   ", ""), ("X" * 60_000, "")]


def _phone(rng: random.Random) -> str:
    return f"+1-{rng.randint(200, 999)}-{rng.randint(200, 999)}-{rng.randint(1000, 9999)}"


def rows() -> list[dict[str, str | int]]:
    """Return the sample rows: every company once (shuffled), then the three bad rows."""
    rng = random.Random(20261122)
    companies = [(c, label) for label, names in COMPANIES.items() for c in names]
    rng.shuffle(companies)
    out = []
    for i, (company, label) in enumerate(companies + BAD_ROWS, start=1):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        city, country = rng.choice(PLACES)
        slug = "".join(ch for ch in company.lower() if ch.isalnum())[:20] or "example"
        out.append({
            "Index": i,
            "Customer Id": f"{rng.getrandbits(48):012X}",
            "First Name": first,
            "Last Name": last,
            "Company": company,
            "City": city,
            "Country": country,
            "Phone 1": _phone(rng),
            "Phone 2": _phone(rng),
            "Email": f"{first.lower()}.{i}@example.com",
            "Subscription Date": f"202{rng.randint(0, 5)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "Website": f"https://www.{slug}.example",
            "Industry": label,
        })
    return out


def render() -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows())
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed file differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is out of date: run python scripts/make_sample_customers.py")
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text):,} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
