from service.client.cli import main

main()
