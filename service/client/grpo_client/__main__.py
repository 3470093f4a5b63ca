from grpo_client.cli import main

main()
